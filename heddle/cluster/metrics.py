"""Per-replica gauges for /metrics, labelled `replica` (read at scrape time)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class ReplicaCollector(Collector):
    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        router = self.cluster.router
        families = {
            "healthy": ("heddle_replica_healthy", "1 while the replica is in the rotation."),
            "running": ("heddle_replica_num_requests_running", "Requests in its running batch."),
            "waiting": ("heddle_replica_num_requests_waiting", "Requests in its waiting queue."),
            "outstanding": (
                "heddle_replica_outstanding_tokens",
                "Prompt and output tokens still to compute on the replica.",
            ),
            "kv": ("heddle_replica_kv_cache_usage_ratio", "Share of its KV blocks in use."),
            "hits": ("heddle_replica_prefix_cache_hit_rate", "Its prefix-cache hit rate."),
        }
        gauges = {
            key: GaugeMetricFamily(name, doc, labels=["replica"])
            for key, (name, doc) in families.items()
        }
        routed = CounterMetricFamily(
            "heddle_replica_routed", "Requests the router sent to the replica.", labels=["replica"]
        )
        for state in router.replicas:
            label = [str(state.replica_id)]
            report = state.report
            gauges["healthy"].add_metric(label, 1.0 if state.healthy else 0.0)
            gauges["running"].add_metric(label, report.num_running)
            gauges["waiting"].add_metric(label, report.num_waiting)
            gauges["outstanding"].add_metric(label, state.outstanding_tokens)
            gauges["kv"].add_metric(label, report.kv_usage)
            gauges["hits"].add_metric(label, report.prefix_hit_rate)
            routed.add_metric(label, router.num_routed[state.replica_id])
        yield from gauges.values()
        yield routed
        yield CounterMetricFamily(
            "heddle_failovers",
            "Sequences resumed on another replica after theirs died.",
            value=self.cluster.num_failovers,
        )
        yield CounterMetricFamily(
            "heddle_router_unplaced",
            "Requests no healthy replica could take (answered 503).",
            value=router.num_unplaced,
        )
