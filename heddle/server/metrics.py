"""Prometheus metrics for /metrics, in a registry of the app's own (never the global one).

Gauges are read from the engine's stats snapshot at scrape time; histograms are fed from the
request records and step stats of each step, which the engine core sends with its step
outputs (in-process: on the engine thread; prometheus-client is thread-safe).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from heddle.engine.client import EngineClient
from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepStat

LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TOKEN_TIME_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512)
TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class _EngineCollector(Collector):
    """Gauges of the engine's current state, read at scrape time."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats
        gauges = (
            ("heddle_num_requests_running", "Requests in the running batch.", s.num_running),
            ("heddle_num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting),
            (
                "heddle_num_requests_preempted",
                "Waiting requests that were preempted and will recompute.",
                s.num_preempted,
            ),
            ("heddle_kv_blocks_used", "KV cache blocks in use.", s.kv_blocks_used),
            ("heddle_kv_blocks_free", "KV cache blocks free.", s.kv_blocks_free),
            (
                "heddle_kv_cache_usage_ratio",
                "Share of KV cache blocks in use.",
                s.kv_blocks_used / max(1, s.kv_blocks_used + s.kv_blocks_free),
            ),
            (
                "heddle_prefix_cache_hit_rate",
                "Prompt tokens found in the prefix cache / prompt tokens looked up.",
                s.prefix_cache_hit_rate,
            ),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)
        yield CounterMetricFamily(
            "heddle_preemptions", "Preemptions since start.", value=s.num_preemptions_total
        )
        yield CounterMetricFamily("heddle_steps", "Engine steps since start.", value=s.num_steps)


class ServerMetrics:
    def __init__(self, engine: EngineClient) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        r = self.registry
        self.ttft = Histogram(
            "heddle_time_to_first_token_seconds",
            "Arrival to first output token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "heddle_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per request.",
            buckets=TOKEN_TIME_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "heddle_e2e_request_latency_seconds",
            "Arrival to finish.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "heddle_request_queue_time_seconds",
            "Arrival to first scheduled.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step_time = Histogram(
            "heddle_step_duration_seconds",
            "Duration of one engine step.",
            buckets=TOKEN_TIME_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "heddle_step_batch_size", "Requests per step.", buckets=BATCH_BUCKETS, registry=r
        )
        self.step_tokens = Histogram(
            "heddle_step_num_tokens",
            "Tokens computed per step.",
            buckets=TOKENS_BUCKETS,
            registry=r,
        )
        self.finished = Counter(
            "heddle_requests_finished",
            "Finished sequences by finish reason.",
            ["finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "heddle_prompt_tokens", "Prompt tokens of finished sequences.", registry=r
        )
        self.generation_tokens = Counter(
            "heddle_generation_tokens", "Output tokens of finished sequences.", registry=r
        )
        self.http_errors = Counter(
            "heddle_http_errors",
            "HTTP requests answered with an error (bad input, queue full, ...), by status.",
            ["status"],
            registry=r,
        )
        self.refused = Counter(
            "heddle_requests_refused",
            "Requests refused at arrival with HTTP 429 (a full queue, or admission control's "
            "prediction that they would miss their TTFT target), by class and reason.",
            ["request_class", "reason"],
            registry=r,
        )
        engine.add_listener(self.observe)
        # A replicated engine (heddle.cluster) adds gauges per replica, labelled `replica`.
        for collector in getattr(engine, "metric_collectors", list)():
            r.register(collector)

    def observe(self, records: list[RequestRecord], steps: list[StepStat]) -> None:
        """After each step: on the engine thread (in-process) or the event loop (core process)."""
        for record in records:
            self.finished.labels(record.finish_reason or "unknown").inc()
            self.prompt_tokens.inc(record.num_prompt_tokens)
            self.generation_tokens.inc(record.num_output_tokens)
            for histogram, value in (
                (self.ttft, record.ttft),
                (self.tpot, record.tpot),
                (self.e2e, record.e2e),
                (self.queue_time, record.queue_time),
            ):
                if value is not None:
                    histogram.observe(value)
        for step in steps:
            self.step_time.observe(step.duration)
            self.batch_size.observe(step.num_requests)
            self.step_tokens.observe(step.num_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
