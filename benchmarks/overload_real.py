"""Overload on the real engine (issue 16, deliverable 5): the collapse, its fix and the shedder
through `heddle serve`, loaded by the bench client (`heddle.bench`) over HTTP.

One workload (long-prompt-mix scaled to two cores as in docs/POLICIES.md "The real engine":
length 0.3, outputs <= 128, short 2 s / long 8 s TTFT targets, long priority 1), one server
per arm (the embedded SmolLM2-135M in fp32, token budget 256, 16 seats), in this order:

- `probe`: fcfs, every request queued at once: the measured capacity (completions per second);
- then each arm at `--load` x that capacity (Poisson arrivals, the same seed), for
  `--duration` seconds (the bench client's max duration: what is still in flight then is cut
  off and counted as unfinished):
  - `mlfq-noguard`: mlfq (thresholds scaled like the lengths), no preemption guard;
  - `mlfq`: the same with the scheduler's preemption guard (default: 10% recompute);
  - `mlfq-shed`: the guard and the SLO shedder (`--admission slo`: HTTP 429 + Retry-After).

Per arm: the short class's TTFT against arrival time (windows of `--window` seconds: a queue
that grows shows as a TTFT that grows), its trend (least-squares slope), completions and
output tokens per second, refusals, preemptions (the server's /metrics). And per window of
the run (by time, `--window` seconds): completions/s, output tokens/s and goodput (requests
completed within their SLO)/s by completion time, preemptions and steps (the server's
/metrics read every window) and the waiting queue: a collapse shows as throughput falling
while preemptions rise, a queue that grows as a waiting count that grows.

    python benchmarks/overload_real.py --capacity 2.18 --duration 170 \
        --output results/overload_real.json

Wall-clock figures: run it under /work/tools/bench (alone on the machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from heddle.bench import run_bench
from heddle.bench.server import wait_healthy
from heddle.hostinfo import free_port, machine_line
from heddle.metrics.stats import LatencyStats
from heddle.metrics.steady import Refused, window_report
from heddle.metrics.summary import is_completed, meets_slo
from heddle.workloads import Workload, get_workload

# fp32 without per-start kernel tuning (the setup of docs/POLICIES.md "The real engine").
SERVER_FLAGS = ["--max-num-batched-tokens", "256", "--max-num-seqs", "16", "--quantization", "none",
                "--dtype", "float32"]  # fmt: skip
MLFQ = ["--policy", "mlfq", "--policy-option", "quantum=4", "--policy-option", "prompt_quantum=128"]
ARMS: dict[str, list[str]] = {
    "probe": ["--policy", "fcfs"],
    "mlfq-noguard": [*MLFQ, "--max-recompute-ratio", "none"],
    "mlfq": MLFQ,
    "mlfq-shed": [*MLFQ, "--admission", "slo"],
}
# (class, TTFT target s, TPOT target s, priority): the CPU-scale SLOs of the policy study.
CLASSES = {"short": (2.0, 0.25, 0), "long": (8.0, 0.5, 1)}


def workload(num_requests: int, rate: float, seed: int) -> Workload:
    base = get_workload(
        "long-prompt-mix",
        seed=seed,
        num_requests=num_requests,
        rate=rate,
        length_scale=0.3,
        max_output_len=128,
        max_prompt_len=512,
    )
    requests = []
    for r in base.requests:
        ttft, tpot, priority = CLASSES.get(r.request_class, CLASSES["short"])
        requests.append(replace(r, ttft_slo=ttft, tpot_slo=tpot, priority=priority))
    return Workload(base.name, base.params, base.seed, requests)


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples (over its labels)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            match = re.match(rf"{name}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", line)
            if match:
                total += float(match.group(2))
    return total


class Server:
    def __init__(self, flags: list[str]) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "heddle", "serve", "--port", str(self.port),
                   "--log-level", "warning", *SERVER_FLAGS, *flags]  # fmt: skip
        self.process = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout: float = 300.0) -> None:
        wait_healthy(self.process, self.base_url, timeout, poll=0.25)

    def metrics(self) -> str:
        return httpx.get(f"{self.base_url}/metrics", timeout=10).text

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class MetricsPoller:
    """Reads the server's /metrics every `every` seconds in a thread while the load runs: the
    counters' course over the run (preemptions, steps) and the waiting queue."""

    def __init__(self, server: Server, every: float) -> None:
        self.server = server
        self.every = every
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=30)
        self._sample()

    def _sample(self) -> None:
        try:
            text = self.server.metrics()
        except httpx.HTTPError:
            return
        self.samples.append({
            "t": time.perf_counter() - self._t0,
            "preemptions": metric(text, "heddle_preemptions_total"),
            "steps": metric(text, "heddle_steps_total"),
            "waiting": metric(text, "heddle_num_requests_waiting"),
            "running": metric(text, "heddle_num_requests_running"),
        })  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()


def run_arm(name: str, load: Workload, duration: float, window: float = 15.0) -> dict[str, Any]:
    server = Server(ARMS[name])
    poller: MetricsPoller | None = None
    try:
        server.wait_ready()
        # One request first: the first step's warm-up is not part of the run.
        httpx.post(
            f"{server.base_url}/v1/completions",
            json={"prompt": "warm up", "max_tokens": 4},
            timeout=120,
        ).raise_for_status()
        before = server.metrics()
        rate = load.params.get("rate")
        poller = MetricsPoller(server, window)
        poller.start()
        result = run_bench(
            server.base_url,
            load,
            request_rate=None if rate is None or math.isinf(rate) else rate,
            concurrency=None if rate is not None and math.isfinite(rate) else 10_000,
            max_duration=duration,
            request_timeout=duration,
        )
        poller.stop()
        after = server.metrics()
    finally:
        if poller is not None:
            poller.stop()
        server.stop()
    row = summarize_arm(name, result, before, after, duration, window)
    row["by_time"] = by_time(result.records, poller.samples, result.wall_time, window)
    return row


def by_time(
    records: list[Any], samples: list[dict[str, float]], span: float, width: float
) -> list[dict[str, Any]]:
    """Per `width`-second window of the run: completions, output tokens and goodput (completed
    within the request's SLO) per second by completion / token time, and from the /metrics
    samples the preemptions and steps in the window and the waiting queue at its end. The
    poller's clock starts a little before the load's (the first sample), so its windows lead
    the records' by under a second."""
    out = []
    t = 0.0
    while t < span - width / 2:  # a last part-window under half a window is left out
        end = t + width
        done = [r for r in records if is_completed(r) and t <= r.finish_time < end]
        tokens = sum(1 for r in records for x in r.token_times if t <= x < end)
        first, last = _nearest(samples, t, width), _nearest(samples, end, width)
        if end >= span - width / 2 and samples:
            last = samples[-1]  # the poller's last sample, taken when the load ended
        row: dict[str, Any] = {
            "start": t,
            "completions_per_s": len(done) / width,
            "output_tok_s": tokens / width,
            "goodput": sum(1 for r in done if meets_slo(r, None)) / width,
            "short_goodput": sum(
                1 for r in done if r.request_class == "short" and meets_slo(r, None)
            )
            / width,
        }
        if first is not None and last is not None and last["t"] > first["t"]:
            row["preemptions"] = last["preemptions"] - first["preemptions"]
            row["steps"] = last["steps"] - first["steps"]
            row["waiting"] = last["waiting"]
        out.append(row)
        t = end
    return out


def _nearest(samples: list[dict[str, float]], t: float, width: float) -> dict[str, float] | None:
    """The /metrics sample taken nearest to time `t`, if one is within half a window of it."""
    best = min(samples, key=lambda x: abs(x["t"] - t), default=None)
    return best if best is not None and abs(best["t"] - t) <= width / 2 else None


def summarize_arm(
    name: str, result: Any, before: str, after: str, duration: float, window: float = 15.0
) -> dict[str, Any]:
    records = result.records
    refused = [
        Refused(r["request_id"], r["arrival_time"], r["request_class"], "429")
        for r in result.refused
    ]
    # The whole arrival span (no warm-up cut: the trend from the start is the point here).
    end = max([r.arrival_time for r in records] + [x.arrival_time for x in refused] + [0.0])
    report = window_report(
        records, refused, intervals=[(0.0, math.nextafter(end, math.inf))], classes=("short",)
    )
    short, overall = report.classes["short"], report.overall
    done = [r for r in records if r.finish_reason not in ("abort", "error")]
    return {
        "arm": name,
        "duration": duration,
        "sent": len(records) + len(refused),
        "not_sent": result.num_not_sent,
        "completed": sum(1 for r in done if r.finish_time is not None),
        "cut_off": sum(1 for r in records if r.finish_reason == "abort"),
        "refused": len(refused),
        "refused_by_class": {c: v.refused for c, v in result.refusals.classes.items() if c != "all"}
        if result.refusals
        else {},
        # The probe's arrivals are all at t=0: its rate is over the run's span instead.
        "completions_per_s": result.summary.overall.request_throughput
        if name == "probe"
        else overall.request_throughput,
        "short_completions_per_s": short.request_throughput,
        "output_tok_s": overall.output_throughput,
        "total_tok_s": overall.total_token_throughput,
        "short_ttft_p50": short.ttft.p50,
        "short_ttft_p99": short.ttft.p99,
        "short_ttft_trend": short.ttft_trend,
        "short_goodput": short.goodput,
        "goodput": overall.goodput,
        "short_ttft_by_window": by_window(records, "short", result.wall_time, window),
        "preemptions": metric(after, "heddle_preemptions_total")
        - metric(before, "heddle_preemptions_total"),
        "steps": metric(after, "heddle_steps_total") - metric(before, "heddle_steps_total"),
    }


def by_window(records: list[Any], cls: str, span: float, width: float = 15.0) -> list[Any]:
    """Short-class TTFT p50/p99 by arrival window; requests cut off before their first token
    enter with their wait so far (censored), so a growing queue shows."""
    out = []
    t = 0.0
    while t < span:
        ttfts = []
        for r in records:
            if r.request_class != cls or not t <= r.arrival_time < t + width:
                continue
            if r.ttft is not None:
                ttfts.append(r.ttft)
            elif r.finish_time is not None:
                ttfts.append(r.finish_time - r.arrival_time)
        stats = LatencyStats.of(ttfts)
        out.append({"start": t, "n": len(ttfts), "p50": stats.p50, "p99": stats.p99})
        t += width
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", default="mlfq-noguard,mlfq,mlfq-shed")
    parser.add_argument("--load", type=float, default=1.5, help="x the probe's capacity")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per arm")
    parser.add_argument("--probe-requests", type=int, default=48)
    parser.add_argument("--probe-duration", type=float, default=40.0)
    parser.add_argument("--capacity", type=float, default=None, help="req/s: skip the probe")
    parser.add_argument("--window", type=float, default=15.0, help="seconds per time window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="results/overload_real.json")
    args = parser.parse_args(argv)
    # A timeout's SIGTERM ends the run through the `finally` blocks, which stop the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; known: {', '.join(ARMS)}")
    started = time.perf_counter()
    rows = []
    capacity = args.capacity
    if capacity is None:
        probe = run_arm(
            "probe", workload(args.probe_requests, math.inf, args.seed), args.probe_duration
        )
        rows.append(probe)
        capacity = probe["completions_per_s"]
        if not capacity:
            raise SystemExit("the probe completed no request: raise --probe-duration")
        print(f"probe: {capacity:.2f} req/s", file=sys.stderr, flush=True)
    rate = args.load * capacity
    for arm in args.arms.split(","):
        num = max(1, math.ceil(rate * args.duration))
        row = run_arm(arm, workload(num, rate, args.seed), args.duration, args.window)
        row["rate"] = rate
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("short_ttft_by_window",
              "by_time")}), file=sys.stderr, flush=True)  # fmt: skip
        print(time_table(row), file=sys.stderr, flush=True)
        save(args.output, rows, capacity, args.load, started)
    out = save(args.output, rows, capacity, args.load, started)
    print(table(out))
    for row in out["rows"]:
        if row.get("by_time"):
            print(f"\n{row['arm']}:\n{time_table(row)}")
    return 0


def save(
    path: str, rows: list[dict[str, Any]], capacity: float, load: float, started: float
) -> dict[str, Any]:
    """Written after every arm, so a run cut short keeps what it measured."""
    machine = f"{machine_line()}; Python {platform.python_version()}"
    out = {
        "command": " ".join(sys.argv),
        "machine": machine,
        "capacity": capacity,
        "load": load,
        "rows": rows,
        "wall_seconds": time.perf_counter() - started,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1))
    return out


def table(out: dict[str, Any]) -> str:
    head = ["arm", "sent", "completed", "refused", "req/s", "short req/s", "output tok/s",
            "short TTFT p50 (s)", "short TTFT p99 (s)", "short trend (s/s)", "short goodput",
            "preemptions", "short TTFT p99 by 15 s window"]  # fmt: skip
    lines = [f"<!-- {out['command']}; {out['machine']}; capacity {out['capacity']:.2f} req/s -->"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in out["rows"]:
        trend = " / ".join(f(w["p99"], ".1f") for w in r["short_ttft_by_window"] if w["n"])
        lines.append(
            "| " + " | ".join([
                r["arm"], str(r["sent"]), str(r["completed"]), str(r["refused"]),
                f(r["completions_per_s"], ".2f"), f(r["short_completions_per_s"], ".2f"),
                f(r["output_tok_s"], ".0f"), f(r["short_ttft_p50"], ".2f"),
                f(r["short_ttft_p99"], ".2f"), f(r["short_ttft_trend"], ".3f"),
                f(r["short_goodput"], ".2f"), f(r["preemptions"], ".0f"), trend,
            ]) + " |"
        )  # fmt: skip
    return "\n".join(lines)


def time_table(row: dict[str, Any]) -> str:
    """One arm's course over time: a line per window."""
    head = ["window (s)", "completions/s", "output tok/s", "goodput/s", "short goodput/s",
            "short TTFT p99 (s, by arrival)", "preemptions", "steps", "waiting at end"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ttft = {w["start"]: w for w in row.get("short_ttft_by_window", [])}
    for w in row["by_time"]:
        arrival = ttft.get(w["start"])
        p99 = "-" if arrival is None or arrival["p99"] is None else f"{arrival['p99']:.1f}"
        cells = [f"{w['start']:.0f}", f"{w['completions_per_s']:.2f}", f"{w['output_tok_s']:.0f}",
                 f"{w['goodput']:.2f}", f"{w['short_goodput']:.2f}", p99,
                 f"{w.get('preemptions', float('nan')):.0f}", f"{w.get('steps', float('nan')):.0f}",
                 f"{w.get('waiting', float('nan')):.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
