"""Agent sessions: retention of paused programs' KV x program-level scheduling (docs/AGENTS.md).

Each point runs one agent workload through the real Engine, Scheduler, KV manager and session
manager with a scheduling policy (fcfs or plas) and a retention policy (lru: nothing parked, what
engines do today; ttl: a fixed pin, Continuum-like; cost: heddle's keep / drop decision):

  sim   on a virtual clock with the roofline cost model (Llama-3.1-8B on one H100 by default),
        at a KV pool small enough that KV memory binds;
  real  on the embedded model (SmolLM2-135M, CPU) in real time, at a scaled size.

    python benchmarks/agents_sessions.py sim --output-dir results/agents
    python benchmarks/agents_sessions.py sim --workloads agent-swe --loads 0.3 \
        --workload-option tool_time_factor=10            # tools 10x slower than announced
    python benchmarks/agents_sessions.py real --workloads agent-bfcl --loads 0.5 --num-programs 8
    python benchmarks/agents_sessions.py sim --workloads agent-swe --loads 0.3 --num-programs 180 \
        --seeds 1 --configs fcfs:lru,fcfs:ttl,fcfs:cost+tier --offload-blocks 32000 \
        --output-dir results/agents-steady --tag _0.3-n180-s1   # cost + the second tier
    python benchmarks/agents_sessions.py summarize results/agents-steady/agents-sim_*.json
    python benchmarks/agents_sessions.py by-seed results/swe-scan/agents-sim_*.json  # per seed,
        # growth from 180 to 360 programs (steadiness) and ratios against fcfs+lru
    python benchmarks/agents_sessions.py horizon results/swe-scan/*.json results/swe-horizon/*.json
        # PCT against run length (180 / 360 / 1,080 / 3,240 programs), late vs early half,
        # recomputed tokens per program, and each ratio's verdict (steady / capacity / both grow)
    python benchmarks/agents_sessions.py windows [--every 180] [--at 2] results/swe-horizon/*.json
        # inside the longest run: the ratio over its first 180, 360, ... programs and per window,
        # the queue per window, and from how many programs on the ratio stays >= 2x
    python benchmarks/agents_sessions.py workload-stats --load 0.35   # what each seed offers
    python benchmarks/agents_sessions.py plot-queue OUT.png FILES...    # waiting requests, KV use

Per point: program completion time (mean, p50, p95), per-call TTFT (mean, p95), program
throughput, tokens computed and recomputed (computed beyond what the programs' new tokens need:
prefix evictions and preemptions), preemptions, and the parked share of the KV pool over time
(a plot per workload and load with --output-dir). Every run ends with zero leaked blocks
(Engine.check_integrity after releasing what is still parked).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heddle.clock import Clock, VirtualClock, WallClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.engine.engine import Engine
from heddle.engine.replay import ReplayResult, replay
from heddle.metrics.stats import percentile
from heddle.sessions.retention import Costs
from heddle.workloads import Workload, get_workload
from heddle.workloads.agent import AgentProgram

CONFIGS = ("fcfs:lru", "fcfs:ttl", "fcfs:cost", "plas:lru", "plas:ttl", "plas:cost")
SIM_EOS = 2


@dataclass
class Point:
    workload: str
    load: float  # programs per second
    policy: str
    retention: str
    num_programs: int
    completed: int
    pct_mean: float
    pct_p50: float
    pct_p95: float
    ttft_mean: float
    ttft_p95: float
    throughput: float  # programs per second
    tokens_computed: int
    tokens_recomputed: int
    preemptions: int
    kv_used_mean: float  # share of the pool in use, averaged over steps
    parked_mean: float  # share of the pool held by parked sessions, averaged over steps
    sessions: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    parked_series: list[tuple[float, float]] = field(default_factory=list)
    seed: int = 0
    # Steady state: programs that arrived after the warm-up and before the drain (fractions of
    # the arrival span), so that neither the filling nor the emptying system is measured.
    steady_programs: int = 0
    steady_mean: float = math.nan
    steady_p95: float = math.nan
    tier: dict[str, float] = field(default_factory=dict)  # second-tier counters (+tier)
    offload_blocks: int = 0
    # (time, share of the pool used, requests waiting, requests running), ~400 samples
    queue_series: list[tuple[float, float, int, int]] = field(default_factory=list)
    leaked_blocks: int = -1  # KV blocks still held after the run (checked: must be 0)
    leaked_tier_slots: int = -1  # second-tier slots still held after the run
    # (arrival since the first arrival, completion time or None, tool time) per program, by
    # arrival: the PCT against arrival time, for the windowed steadiness check (`horizon`)
    program_series: list[tuple[float, float | None, float]] = field(default_factory=list)


class SamplingExecutor:
    """Wraps an executor; after every step samples the parked and used shares of the pool."""

    def __init__(self, inner: Any, clock: Clock) -> None:
        self.inner = inner
        self.clock = clock
        self.cost_model = getattr(inner, "cost_model", None)  # heddle.sessions' recompute costs
        self.engine: Engine | None = None
        # (time, parked blocks, used blocks, requests waiting, requests running)
        self.samples: list[tuple[float, int, int, int, int]] = []
        self.tokens_computed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        output = self.inner.execute(scheduler_output)
        self.tokens_computed += scheduler_output.num_scheduled_tokens
        if self.engine is not None:
            kv, scheduler = self.engine.kv_cache, self.engine.scheduler
            self.samples.append((self.clock.now(), kv.num_parked_blocks, kv.num_used_blocks,
                                 len(scheduler.waiting), len(scheduler.running)))
        return output


def minimum_tokens(workload: Workload, result: ReplayResult) -> int:
    """Tokens a run must compute if no session ever recomputes: each call's new prompt tokens
    (what its context adds to what the program computed before, a shared system prompt once)
    and its outputs but the last (sampled, never fed back)."""
    records = {r.request_id: r for r in result.records}
    seen_prefixes: set[tuple[tuple[str, int], ...]] = set()
    total = 0

    def walk(program: AgentProgram, inherited_first: int) -> None:
        nonlocal total
        inherited = inherited_first
        for k, call in enumerate(program.calls):
            record = records.get(program.request_id(k))
            if record is None:
                return
            output = len(record.token_times)
            total += max(0, record.num_prompt_tokens - inherited) + max(0, output - 1)
            for child in call.subagents:
                walk(child, record.num_prompt_tokens + output - 1)
            inherited = record.num_prompt_tokens + output - 1

    for program in workload.programs:
        # The prefix cache finds a shared prefix only as a chain from the prompt's start.
        shared = 0
        segments = program.shared_prefix
        for i in range(len(segments)):
            if segments[: i + 1] not in seen_prefixes:
                break
            shared += segments[i][1]
        for i in range(len(segments)):
            seen_prefixes.add(segments[: i + 1])
        walk(program, shared)
    return total


def run_point(
    mode: str,
    workload_name: str,
    load: float,
    config_name: str,
    args: argparse.Namespace,
    executor_factory: Any,
    num_blocks: int,
    vocab_size: int,
    max_model_len: int | None,
    recompute: Costs | None,
    tokenizer: Any = None,
    eos_token_id: int | None = SIM_EOS,
) -> Point:
    policy, retention = config_name.split(":")
    offload = 0
    if retention.endswith("+tier"):  # the retention policy with the second tier behind it
        retention = retention.removesuffix("+tier")
        offload = args.offload_blocks
        if offload <= 0:
            raise SystemExit(f"{config_name}: give --offload-blocks N (the tier's size)")
    options = parse_options(args.workload_option)
    workload = get_workload(
        workload_name, seed=args.seed, num_requests=args.num_programs, rate=load, **options
    )
    retention_options: dict[str, object] = {"ttl": args.ttl} if retention == "ttl" else {}
    config = EngineConfig(
        cache=CacheConfig(block_size=args.block_size, offload_blocks=offload),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            policy=policy,
            retention=retention,
            retention_options=retention_options,
        ),
    )
    clock: Clock = VirtualClock() if mode == "sim" else WallClock()
    executor = SamplingExecutor(executor_factory(clock, offload), clock)
    engine = Engine(
        config,
        executor,
        num_blocks=num_blocks,
        clock=clock,
        tokenizer=tokenizer,
        eos_token_id=eos_token_id,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        final_outputs_only=True,
    )
    if recompute is not None:
        sessions = engine.scheduler.sessions
        sessions.costs = Costs(recompute.recompute_seconds, sessions.costs.copy_seconds)
    executor.engine = engine
    start = time.perf_counter()
    result = replay(engine, workload, vocab_size=vocab_size)  # ends with check_integrity
    wall = time.perf_counter() - start
    # Leaks: once every program has ended (and replay has released what was still parked), no
    # block of the pool and no slot of the second tier may still be held.
    tier = engine.scheduler.sessions.tier
    leaked_blocks = engine.kv_cache.num_used_blocks
    leaked_slots = tier.num_used_slots if tier is not None else 0
    if leaked_blocks or leaked_slots:
        raise AssertionError(f"{leaked_blocks} KV blocks and {leaked_slots} second-tier slots "
                             "leaked")
    tier_stats: dict[str, float] = {}
    if tier is not None:
        tier_stats = {k: float(v) for k, v in asdict(tier.stats).items()}
        tier_stats["copy_seconds"] = float(
            getattr(executor.inner, "tier_seconds", 0.0)
            or getattr(getattr(executor.inner, "tier", None), "copy_seconds", 0.0)
        )
    pcts = [p.completion_time for p in result.programs if p.completion_time is not None]
    ttfts = [
        r.first_token_time - r.arrival_time
        for r in result.records
        if r.first_token_time is not None
    ]
    minimum = minimum_tokens(workload, result)
    steady = steady_pcts(result, args.warmup_fraction, args.drain_fraction)
    samples = executor.samples
    t0 = result.start_time
    step = max(1, len(samples) // 400)
    stats = engine.scheduler.sessions.stats
    return Point(
        workload=workload_name,
        load=load,
        policy=policy,
        retention=f"{retention}+tier" if offload else retention,
        num_programs=len(result.programs),
        completed=len(pcts),
        pct_mean=statistics.fmean(pcts) if pcts else math.nan,
        pct_p50=_pct(pcts, 50),
        pct_p95=_pct(pcts, 95),
        ttft_mean=statistics.fmean(ttfts) if ttfts else math.nan,
        ttft_p95=_pct(ttfts, 95),
        throughput=len(pcts) / result.elapsed if result.elapsed else 0.0,
        tokens_computed=executor.tokens_computed,
        tokens_recomputed=executor.tokens_computed - minimum,
        preemptions=result.num_preemptions,
        kv_used_mean=statistics.fmean(s[2] for s in samples) / num_blocks if samples else 0,
        parked_mean=statistics.fmean(s[1] for s in samples) / num_blocks if samples else 0,
        sessions=asdict(stats),
        wall_seconds=wall,
        parked_series=[(s[0] - t0, s[1] / num_blocks) for s in samples[::step]],
        queue_series=[(s[0] - t0, s[2] / num_blocks, s[3], s[4]) for s in samples[::step]],
        seed=args.seed,
        steady_programs=len(steady),
        steady_mean=statistics.fmean(steady) if steady else math.nan,
        steady_p95=_pct(steady, 95),
        tier=tier_stats,
        offload_blocks=offload,
        leaked_blocks=leaked_blocks,
        leaked_tier_slots=leaked_slots,
        program_series=program_series(result),
    )


def program_series(result: ReplayResult) -> list[tuple[float, float | None, float]]:
    programs = sorted(result.programs, key=lambda p: p.arrival_time)
    if not programs:
        return []
    t0 = programs[0].arrival_time
    return [(round(p.arrival_time - t0, 3),
             None if p.completion_time is None else round(p.completion_time, 3),
             round(p.tool_time, 3))
            for p in programs]


def steady_pcts(result: ReplayResult, warmup: float, drain: float) -> list[float]:
    """Completion times of the programs that arrived inside the steady window: after the first
    `warmup` and before the last `drain` fraction of the arrival span (heddle.metrics.steady's
    window, with the drain cut too: every program here runs to its end)."""
    arrivals = [p.arrival_time for p in result.programs]
    if not arrivals:
        return []
    first, last = min(arrivals), max(arrivals)
    lo, hi = first + warmup * (last - first), last - drain * (last - first)
    return [
        p.completion_time
        for p in result.programs
        if p.completion_time is not None and lo <= p.arrival_time <= hi
    ]


def _pct(values: list[float], q: float) -> float:
    return percentile(sorted(values), q) if values else math.nan


def parse_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def sim_setup(args: argparse.Namespace) -> dict[str, Any]:
    from heddle.sim import RooflineCostModel, load_hardware_spec, load_model_spec
    from heddle.sim.executor import SimulatedExecutor

    model = load_model_spec(args.model)
    hardware = load_hardware_spec(args.hardware)
    cost = RooflineCostModel(model, hardware, tp=1)
    vocab = model.vocab_size
    bandwidth = hardware.host_bandwidth
    per_block = model.kv_bytes_per_token() * args.block_size / bandwidth if bandwidth else 0.0

    def factory(clock: Clock, offload: int) -> SimulatedExecutor:
        return SimulatedExecutor(
            cost, clock, vocab_size=vocab,
            tier_seconds_per_block=per_block if offload and per_block else None,
        )

    return {
        "executor_factory": factory,
        "num_blocks": args.num_blocks,
        "vocab_size": vocab,
        "max_model_len": None,
        "recompute": None,  # from the cost model (heddle.sessions.manager.recompute_cost_of)
        "describe": f"simulator: {args.model} on one {args.hardware} (roofline), "
        f"{args.num_blocks} KV blocks of {args.block_size} tokens; second tier (+tier): "
        f"{args.offload_blocks} blocks at {hardware.host_bandwidth / 1e9:g} GB/s "
        f"({per_block * 1e3:.3f} ms per block one way)",
    }


def real_setup(args: argparse.Namespace) -> dict[str, Any]:
    from heddle.config import ModelConfig
    from heddle.model.executor import ModelExecutor

    cache = CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks)
    executor = ModelExecutor(ModelConfig(num_threads=args.threads), cache)
    seconds_per_token = measure_prefill(executor, args)

    def factory(clock: Clock, offload: int) -> Any:
        executor.attach_tier(offload)  # a fresh buffer (or none) per point
        return executor

    return {
        "executor_factory": factory,
        "num_blocks": executor.num_blocks,
        "vocab_size": executor.model_shape.vocab_size,
        "max_model_len": executor.max_model_len,
        "recompute": Costs(lambda n: n * seconds_per_token),
        "tokenizer": executor.tokenizer,
        "eos_token_id": executor.eos_token_id,
        "describe": f"real engine: SmolLM2-135M Q4_1 on CPU, {args.threads} threads, "
        f"{executor.num_blocks} KV blocks of {args.block_size} tokens, measured prefill "
        f"{seconds_per_token * 1e3:.3f} ms/token",
    }


def measure_prefill(executor: Any, args: argparse.Namespace) -> float:
    """Seconds per prefill token of the real model (median of 3 prompts of 256 tokens)."""
    from heddle.request import SamplingParams

    config = EngineConfig(cache=CacheConfig(block_size=args.block_size))
    times = []
    for i in range(4):
        engine = Engine(
            config,
            executor,
            num_blocks=executor.num_blocks,
            eos_token_id=executor.eos_token_id,
            vocab_size=executor.model_shape.vocab_size,
        )
        prompt = [100 + (7 * j + i) % 5000 for j in range(256)]
        start = time.perf_counter()
        engine.add_request(f"warm-{i}", prompt, SamplingParams(max_tokens=1, temperature=0.0))
        while engine.has_unfinished_requests():
            engine.step()
        if i:  # the first one warms up
            times.append((time.perf_counter() - start) / len(prompt))
    return statistics.median(times)


def machine() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = next(line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line)
        wanted = ("avx512f", "avx512_bf16", "amx_bf16", "amx_int8")
        present = set(next(line for line in info.splitlines() if line.startswith("flags")).split())
        flags = " ".join(f for f in wanted if f in present)
    except (OSError, StopIteration):
        name = platform.processor()
    return f"{name}, {os.cpu_count()} cores ({flags})"


def plot_parked(points: list[Point], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for point in points:
        if point.retention == "lru":
            continue
        xs = [t for t, _ in point.parked_series]
        ys = [100 * share for _, share in point.parked_series]
        axes.plot(xs, ys, label=f"{point.policy}+{point.retention}", linewidth=1)
    first = points[0]
    axes.set_title(f"{first.workload} at {first.load:g} programs/s: parked share of the KV pool")
    axes.set_xlabel("time (s)")
    axes.set_ylabel("parked blocks (% of pool)")
    axes.legend()
    figure.savefig(path, dpi=110, bbox_inches="tight")


def table(points: list[Point]) -> str:
    head = (
        "| workload | load | policy | retention | PCT mean | p50 | p95 | TTFT mean | TTFT p95 "
        "| programs/s | computed | recomputed | preempt | KV used | parked |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {p.workload} | {p.load:g} | {p.policy} | {p.retention} | {p.pct_mean:.1f} "
        f"| {p.pct_p50:.1f} | {p.pct_p95:.1f} | {p.ttft_mean:.2f} | {p.ttft_p95:.2f} "
        f"| {p.throughput:.3f} | {p.tokens_computed / 1e3:.0f}k | {p.tokens_recomputed / 1e3:.0f}k "
        f"| {p.preemptions} | {100 * p.kv_used_mean:.0f}% | {100 * p.parked_mean:.0f}% |"
        for p in points
    ]
    return head + "\n".join(rows)


def summarize(paths: list[str]) -> str:
    """Points of several runs (JSON files) merged: per workload, load, run length and config,
    the mean over seeds with its 95% interval (t), for the whole run and the steady window."""
    from heddle.metrics.steady import interval

    groups: dict[tuple[str, float, int, str], list[dict[str, Any]]] = {}
    for path in paths:
        for point in json.loads(Path(path).read_text())["points"]:
            config = f"{point['policy']}+{point['retention']}"
            key = (point["workload"], point["load"], point["num_programs"], config)
            groups.setdefault(key, []).append(point)
    lines = [
        "| workload | load | programs | config | seeds | PCT mean | PCT p95 | steady PCT mean "
        "| steady p95 | recomputed | preempt |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (workload, load, n, config), points in sorted(groups.items()):
        def iv(name: str, fmt: str = ".1f", points: list[dict[str, Any]] = points) -> str:
            return interval(p[name] for p in points).text(fmt)

        recomputed = interval(p["tokens_recomputed"] / 1e3 for p in points).text(".0f")
        lines.append(
            f"| {workload} | {load:g} | {n} | {config} | {len(points)} | {iv('pct_mean')} "
            f"| {iv('pct_p95')} | {iv('steady_mean')} | {iv('steady_p95')} | {recomputed}k "
            f"| {iv('preemptions', '.0f')} |"
        )
    return "\n".join(lines)


GROWTH_STEADY = 1.10  # a mean that grows more than this from one horizon to twice it: unsteady


def _pool(data: dict[str, Any]) -> int:
    """The KV pool of a run (blocks), read from its setup line."""
    words = data["setup"].split()
    return int(words[words.index("KV") - 1]) if "KV" in words else 0


def by_seed(paths: list[str], base: str = "fcfs+lru") -> str:
    """Per workload, load, pool and seed: each configuration's mean program completion time at
    each run length, its growth from the shortest to the longest (a queue that grows with the
    run: not steady, marked *), and the ratio of `base` to each other configuration at the
    longest run length; then per (workload, load, pool, length) the ratios' median and range
    over seeds, counting only the seeds where both configurations are steady."""
    runs: dict[tuple[str, float, int, int], dict[str, dict[int, float]]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for point in data["points"]:
            key = (point["workload"], point["load"], _pool(data), point["seed"])
            config = f"{point['policy']}+{point['retention']}"
            runs.setdefault(key, {}).setdefault(config, {})[point["num_programs"]] = point[
                "pct_mean"
            ]

    def growth(by_n: dict[int, float]) -> float | None:
        ns = sorted(by_n)
        return by_n[ns[-1]] / by_n[ns[0]] if len(ns) > 1 else None

    configs = sorted({c for r in runs.values() for c in r}, key=lambda c: (c != base, c))
    lines = [
        "| workload | load | pool | seed | " + " | ".join(configs) + " | "
        + " | ".join(f"{base} / {c}" for c in configs if c != base) + " |",
        "|---" * (4 + 2 * len(configs) - 1) + "|",
    ]
    verdicts: dict[tuple[str, float, int, str], list[tuple[float, bool]]] = {}
    for (workload, load, pool, seed), by_config in sorted(runs.items()):
        cells = []
        for config in configs:
            by_n = by_config.get(config, {})
            g = growth(by_n)
            text = " / ".join(f"{by_n[n]:.1f}" for n in sorted(by_n)) or "-"
            if g is not None:
                text += f" (x{g:.2f}{'*' if g > GROWTH_STEADY else ''})"
            cells.append(text)
        ratio_cells = []
        b = by_config.get(base, {})
        for config in configs:
            if config == base:
                continue
            c = by_config.get(config, {})
            common = sorted(set(b) & set(c))
            if not common:
                ratio_cells.append("-")
                continue
            n = common[-1]
            gb, gc = growth(b), growth(c)
            steady = gb is not None and gc is not None and max(gb, gc) <= GROWTH_STEADY
            ratio = b[n] / c[n]
            ratio_cells.append(f"{ratio:.2f}x{'' if steady else '*'}")
            verdicts.setdefault((workload, load, pool, config), []).append((ratio, steady))
        lines.append(f"| {workload} | {load:g} | {pool} | {seed} | " + " | ".join(cells) + " | "
                     + " | ".join(ratio_cells) + " |")
    lines += ["", f"| workload | load | pool | {base} / config | seeds | ratio median (range) "
              "| steady seeds: median (range) |", "|---|---|---|---|---|---|---|"]
    for (workload, load, pool, config), values in sorted(verdicts.items()):
        all_r = [r for r, _ in values]
        steady_r = [r for r, st in values if st]
        st = (f"{len(steady_r)}: {statistics.median(steady_r):.2f}x ({min(steady_r):.2f}-"
              f"{max(steady_r):.2f})" if steady_r else "0")
        lines.append(f"| {workload} | {load:g} | {pool} | {config} | {len(all_r)} | "
                     f"{statistics.median(all_r):.2f}x ({min(all_r):.2f}-{max(all_r):.2f}) "
                     f"| {st} |")
    return "\n".join(lines)


QUEUE_STEADY = 2.0  # requests: a late window waiting at most this (or 1.25x the early one)


def _waiting(point: dict[str, Any]) -> tuple[float, float, float, int] | None:
    """Mean requests waiting over 20-60%, over 60-100% and over the last 20% of the arrival
    span, and the most waiting at once (from the run's queue samples). A queue that grows
    without bound waits more late than early and is still long at the end; a steady one waits
    alike (near nothing here), or drains a burst before the arrivals end. Unlike the mean PCT of
    a window, it does not move with which programs (how long, how heavy) fall in the window."""
    samples = point.get("queue_series")
    if not samples:
        return None
    series = point.get("program_series")
    span = series[-1][0] if series else point["num_programs"] / point["load"]

    def mean(lo: float, hi: float) -> float:
        values = [s[2] for s in samples if lo * span <= s[0] < hi * span]
        return statistics.fmean(values) if values else math.nan

    return mean(0.2, 0.6), mean(0.6, 1.0 + 1e-9), mean(0.8, 1.0 + 1e-9), max(s[2] for s in samples)


def _queue_steady(waiting: tuple[float, float, float, int]) -> bool:
    """Steady: the queue late in the run (60-100% of the arrival span) is no longer than early
    (20-60%; at most 2 requests, or 1.25x), or it has drained back to that by the last 20% while
    programs still arrive at the same rate (a burst that passed: a queue that grows without
    bound cannot shrink before the arrivals stop)."""
    early, late, last, _ = waiting
    bar = max(QUEUE_STEADY, 1.25 * early)
    return late <= bar or last <= bar


def _runs_by_point(
    paths: list[str],
) -> dict[tuple[str, float, int, int], dict[str, dict[int, dict[str, Any]]]]:
    """The saved points of `paths` by (workload, load, pool, seed), then configuration, then
    number of programs."""
    runs: dict[tuple[str, float, int, int], dict[str, dict[int, dict[str, Any]]]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for point in data["points"]:
            key = (point["workload"], point["load"], _pool(data), point["seed"])
            config = f"{point['policy']}+{point['retention']}"
            runs.setdefault(key, {}).setdefault(config, {})[point["num_programs"]] = point
    return runs


def horizon(paths: list[str], base: str = "fcfs+lru") -> str:
    """The PCT-vs-horizon table: per workload, load, pool, seed and configuration, the mean
    program completion time at every run length with its growth from each length to the next;
    the requests waiting early, late and at the end of the longest run (`_waiting`); recomputed
    prompt tokens
    per program there. A configuration is steady when the longest run's queue does not grow
    (`_queue_steady`); the PCT growth is shown beside it (it also moves with the heavy tail of
    the programs a longer run adds). Then per point the ratio of `base` to every other
    configuration at each length, and whether it is a steady verdict (both steady), a capacity
    verdict (`base` grows, the other is steady) or neither."""
    runs = _runs_by_point(paths)
    lines = [
        "| workload | load | pool | seed | config | PCT mean by programs (growth) "
        "| waiting early / late / last (max), longest run | recomputed per program "
        "| queue steady |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratio_lines = [
        "", f"| workload | load | pool | seed | {base} / config | mean PCT ratio by programs "
        "| p95 ratio, recomputed ratio (longest) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (workload, load, pool, seed), by_config in sorted(runs.items()):
        steady_of: dict[str, bool | None] = {}
        for config in sorted(by_config, key=lambda c: (c != base, c)):
            by_n = by_config[config]
            ns = sorted(by_n)
            growths = [by_n[b]["pct_mean"] / by_n[a]["pct_mean"] for a, b in itertools.pairwise(ns)]
            text = f"{ns[0]}: {by_n[ns[0]]['pct_mean']:.1f}"
            for n, g in zip(ns[1:], growths, strict=True):
                text += f" → {n}: {by_n[n]['pct_mean']:.1f} (x{g:.2f})"
            with_queue = [n for n in ns if by_n[n].get("queue_series")]
            waiting = _waiting(by_n[with_queue[-1]]) if with_queue else None
            if waiting:
                steady_of[config] = _queue_steady(waiting)
                queue_text = (f"{waiting[0]:.1f} / {waiting[1]:.1f} / {waiting[2]:.1f} "
                              f"({waiting[3]}), {with_queue[-1]}")
            else:  # an older run without queue samples: the PCT growth decides
                steady_of[config] = max(growths) <= GROWTH_STEADY if growths else None
                queue_text = "- (by PCT growth)"
            longest = by_n[ns[-1]]
            recomputed_of = longest.get("tokens_recomputed")  # None: a real run does not count it
            per_program = (math.nan if recomputed_of is None
                           else recomputed_of / max(1, longest["num_programs"]) / 1e3)
            verdict = {True: "yes", False: "no", None: "?"}[steady_of[config]]
            lines.append(
                f"| {workload} | {load:g} | {pool} | {seed} | {config} | {text} | {queue_text} "
                f"| {per_program:.1f}k | {verdict} |"
            )
        b = by_config.get(base, {})
        for config, c in sorted(by_config.items()):
            common = sorted(set(b) & set(c))
            if config == base or not common:
                continue
            ratios = " / ".join(f"{n}: {b[n]['pct_mean'] / c[n]['pct_mean']:.2f}x"
                                for n in common)
            n = common[-1]
            rb, rc = b[n].get("tokens_recomputed"), c[n].get("tokens_recomputed")
            recomputed = math.nan if rb is None or rc is None else rb / max(1, rc)
            tail = f"{b[n]['pct_p95'] / c[n]['pct_p95']:.2f}x, {recomputed:.1f}x"
            mine, theirs = steady_of.get(config), steady_of.get(base)
            if mine and theirs:
                verdict = "steady (both)"
            elif mine and theirs is False:
                verdict = f"capacity ({base}'s queue grows)"
            elif mine is False and theirs:
                verdict = f"{config}'s queue grows"
            elif mine is False and theirs is False:
                verdict = "both queues grow"
            else:
                verdict = "?"
            ratio_lines.append(
                f"| {workload} | {load:g} | {pool} | {seed} | {config} | {ratios} | {tail} "
                f"| {verdict} |")
    return "\n".join(lines + ratio_lines)


def _windows_of(point: dict[str, Any], every: int) -> list[tuple[int, float, float, float]]:
    """Per window of `every` programs by arrival (the last one may be shorter): the programs seen
    so far, the mean PCT of the first that many programs, the mean PCT of the window's own
    programs, and the mean requests waiting over the window's arrival span (the run's queue
    samples; nan without them)."""
    series = point.get("program_series") or []
    samples = point.get("queue_series") or []
    if not series:
        return []
    pcts = [math.inf if done is None else done for _, done, _ in series]
    rows = []
    for start in range(0, len(series), every):
        stop = min(start + every, len(series))
        lo = series[start][0]
        hi = series[stop][0] if stop < len(series) else math.inf
        waiting = [s[2] for s in samples if lo <= s[0] < hi]
        rows.append((stop, statistics.fmean(pcts[:stop]), statistics.fmean(pcts[start:stop]),
                     statistics.fmean(waiting) if waiting else math.nan))
    return rows


def windows(paths: list[str], base: str = "fcfs+lru", every: int = 180,
            at: float = 2.0) -> str:
    """Inside the longest run both `base` and another configuration made of a point (the same
    programs, the same arrivals): per window of `every` programs by arrival, the ratio of the
    two configurations' mean PCT over the first N programs (how the ratio moves as the run
    gets longer, without rerunning it), the ratio over the window's own programs, and the
    requests each waits over the window. `from N` is the least N from which the prefix ratio
    stays >= `at` to the run's end ("never" if it ends below); the verdict is `horizon`'s
    queue test on the whole run."""
    if every < 1:
        raise SystemExit(f"windows: --every must be a positive number of programs, not {every}")
    runs = _runs_by_point(paths)
    lines = [
        f"| workload | load | pool | seed | {base} / config | programs | prefix mean PCT ratio "
        f"by programs | window ratio by window | waiting per window, {base} ; config "
        f"| >= {at:g}x from | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict[tuple[str, float, int, str, int], list[tuple[int, float, str, int | None]]] = {}
    for (workload, load, pool, seed), by_config in sorted(runs.items()):
        b = by_config.get(base, {})
        for config, c in sorted(by_config.items()):
            common = [n for n in sorted(set(b) & set(c))
                      if b[n].get("program_series") and c[n].get("program_series")]
            if config == base or not common:
                continue
            n = common[-1]
            wb, wc = _windows_of(b[n], every), _windows_of(c[n], every)
            prefix = [rb[1] / rc[1] for rb, rc in zip(wb, wc, strict=True)]
            own = [rb[2] / rc[2] for rb, rc in zip(wb, wc, strict=True)]
            since = None
            for (stop, *_), ratio in zip(reversed(wb), reversed(prefix), strict=True):
                if ratio < at:
                    break
                since = stop
            steady = []
            for point in (b[n], c[n]):
                waiting = _waiting(point)
                steady.append(None if waiting is None else _queue_steady(waiting))
            verdict = {(True, True): "steady (both)", (False, True): "capacity",
                       (True, False): f"{config}'s queue grows",
                       (False, False): "both queues grow"}.get((steady[0], steady[1]), "?")
            summary.setdefault((workload, load, pool, config, n), []).append(
                (seed, prefix[-1], verdict, since))
            lines.append(
                f"| {workload} | {load:g} | {pool} | {seed} | {config} | {n} | "
                + " / ".join(f"{r[0]}: {x:.2f}x" for r, x in zip(wb, prefix, strict=True))
                + " | " + " / ".join(f"{x:.2f}x" for x in own)
                + " | " + " / ".join(f"{rb[3]:.1f}" for rb in wb) + " ; "
                + " / ".join(f"{rc[3]:.1f}" for rc in wc)
                + f" | {'never' if since is None else since} | {verdict} |")
    lines += ["", f"| workload | load | pool | {base} / config | programs | seeds | both steady: "
              "ratio by seed, median | capacity: ratio by seed (>= "
              f"{at:g}x from) | both grow |", "|---|---|---|---|---|---|---|---|---|"]
    for (workload, load, pool, config, n), rows in sorted(summary.items()):
        steady = [(s, r) for s, r, v, _ in rows if v == "steady (both)"]
        capacity = [(s, r, f) for s, r, v, f in rows if v == "capacity"]
        grow = [s for s, _, v, _ in rows if v not in ("steady (both)", "capacity")]
        steady_text = (", ".join(f"s{s} {r:.2f}x" for s, r in steady)
                       + f"; {statistics.median(r for _, r in steady):.2f}x") if steady else "-"
        capacity_text = ", ".join(f"s{s} {r:.2f}x ({'never' if f is None else f})"
                                  for s, r, f in capacity) or "-"
        lines.append(f"| {workload} | {load:g} | {pool} | {config} | {n} | {len(rows)} | "
                     f"{steady_text} | {capacity_text} | "
                     f"{', '.join(f's{s}' for s in grow) or '-'} |")
    return "\n".join(lines)


def plot_queue(argv: list[str]) -> None:
    """The waiting requests and the pool's used share over time of each point in the given
    JSON files (one line per point), to one PNG: `plot-queue OUT.png FILES...`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out, paths = argv[0], argv[1:]
    figure = Figure(figsize=(9, 5))
    FigureCanvasAgg(figure)
    waiting_axes = figure.add_subplot(2, 1, 1)
    used_axes = figure.add_subplot(2, 1, 2, sharex=waiting_axes)
    title = ""
    for path in paths:
        for point in json.loads(Path(path).read_text())["points"]:
            series = point.get("queue_series") or []
            if not series:
                raise SystemExit(f"{path}: no queue_series (run with this version)")
            label = (f"{point['policy']}+{point['retention']}, seed {point['seed']}, "
                     f"{point['num_programs']} programs")
            xs = [t for t, *_ in series]
            waiting_axes.plot(xs, [w for _, _, w, _ in series], label=label, linewidth=1)
            used_axes.plot(xs, [100 * u for _, u, _, _ in series], label=label, linewidth=1)
            title = f"{point['workload']} at {point['load']:g} programs/s"
    waiting_axes.set_title(f"{title}: requests waiting, and the KV pool in use")
    waiting_axes.set_ylabel("requests waiting")
    used_axes.set_ylabel("pool used (%)")
    used_axes.set_xlabel("time (s)")
    waiting_axes.legend(fontsize=8)
    figure.savefig(out, dpi=110, bbox_inches="tight")


def workload_stats(argv: list[str]) -> str:
    """What each seed's draw of a workload offers: the realized arrival rate, the programs'
    final contexts (mean, p95, how many exceed a quarter of the pool) and the context the programs
    carry summed over their calls (each call's prompt + output: the KV a call holds, or what an
    evicted call recomputes), times the realized rate: the KV work offered per second."""
    parser = argparse.ArgumentParser(prog="agents_sessions.py workload-stats")
    parser.add_argument("--workload", default="agent-swe")
    parser.add_argument("--load", type=float, required=True)
    parser.add_argument("--num-programs", default="180,360")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--num-blocks", type=int, default=8000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    quarter_pool = args.num_blocks * args.block_size // 4
    lines = [
        f"| programs | seed | realized programs/s | final context mean | p95 | max | > {quarter_pool} "
        "| context over calls (k tokens / program) | offered (k context tokens / s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in (int(x) for x in args.num_programs.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            programs = get_workload(args.workload, seed=seed, num_requests=n, rate=args.load,
                                    **parse_options(args.workload_option)).programs
            finals, carried = [], []
            for program in programs:
                context = total = 0
                for call in program.calls:
                    context += call.prompt_extra_len + call.output_len
                    total += context
                finals.append(context)
                carried.append(total)
            arrivals = sorted(p.arrival_time for p in programs)
            rate = (n - 1) / (arrivals[-1] - arrivals[0])
            finals.sort()
            lines.append(
                f"| {n} | {seed} | {rate:.3f} | {statistics.fmean(finals):,.0f} "
                f"| {_pct(finals, 95):,.0f} | {finals[-1]:,} "
                f"| {sum(1 for c in finals if c > quarter_pool)} "
                f"| {statistics.fmean(carried) / 1e3:.0f} "
                f"| {rate * statistics.fmean(carried) / 1e3:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "plot-queue":
        plot_queue(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "workload-stats":
        print(workload_stats(sys.argv[2:]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "summarize":
        print(summarize(sys.argv[2:]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "horizon":  # horizon [--base CONFIG] FILES
        rest = sys.argv[2:]
        if rest[:1] == ["--base"]:
            print(horizon(rest[2:], base=rest[1]))
        else:
            print(horizon(rest))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "windows":
        wparser = argparse.ArgumentParser(prog="agents_sessions.py windows",
                                          description=windows.__doc__)
        wparser.add_argument("--base", default="fcfs+lru")
        wparser.add_argument("--every", type=int, default=180, help="programs per window")
        wparser.add_argument("--at", type=float, default=2.0, help="the ratio of `from N`")
        wparser.add_argument("files", nargs="+")
        wargs = wparser.parse_args(sys.argv[2:])
        print(windows(wargs.files, base=wargs.base, every=wargs.every, at=wargs.at))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "by-seed":  # by-seed [--base CONFIG] FILES
        rest = sys.argv[2:]
        if rest[:1] == ["--base"]:
            print(by_seed(rest[2:], base=rest[1]))
        else:
            print(by_seed(rest))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("sim", "real"))
    parser.add_argument("--workloads", default="agent-swe,agent-bfcl,agent-fanout")
    parser.add_argument("--loads", default=None, help="programs/s, comma-separated")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="policy:retention,...")
    parser.add_argument("--num-programs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--ttl", type=float, default=2.0, help="the fixed pin of `ttl` (s)")
    parser.add_argument("--threads", type=int, default=2, help="real: torch threads")
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--offload-blocks", type=int, default=0,
                        help="the second tier's size in blocks, for configs with +tier")
    parser.add_argument("--seeds", default=None, help="comma-separated (overrides --seed)")
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--drain-fraction", type=float, default=0.2)
    parser.add_argument("--tag", default="", help="suffix of the JSON file's name")
    args = parser.parse_args()
    sim = args.mode == "sim"
    if args.num_blocks is None:
        args.num_blocks = 8000 if sim else 160
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = 8192 if sim else 512
    if args.max_num_seqs is None:
        args.max_num_seqs = 256 if sim else 16
    loads = [float(x) for x in (args.loads or ("0.15,0.3,0.45" if sim else "0.5")).split(",")]
    setup = sim_setup(args) if sim else real_setup(args)
    describe = setup.pop("describe")
    print(f"# {describe}; machine: {machine()}", flush=True)
    points: list[Point] = []
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    for seed in seeds:
        args.seed = seed
        for workload in args.workloads.split(","):
            for load in loads:
                group = []
                for config_name in args.configs.split(","):
                    point = run_point(args.mode, workload, load, config_name, args, **setup)
                    group.append(point)
                    print(table([point]).splitlines()[-1], f"seed {seed}",
                          f"steady {point.steady_mean:.1f}/{point.steady_p95:.1f} "
                          f"({point.steady_programs})", f"({point.wall_seconds:.0f} s)",
                          f"leaked blocks {point.leaked_blocks}, tier slots "
                          f"{point.leaked_tier_slots}", flush=True)
                points.extend(group)
                if out_dir is not None:
                    name = f"parked-{args.mode}-{workload}-{load:g}-s{seed}{args.tag}.png"
                    plot_parked(group, out_dir / name)
    print()
    print(table(points))
    if out_dir is not None:
        data = {
            "command": " ".join(sys.argv),
            "setup": describe,
            "machine": machine(),
            "points": [asdict(p) for p in points],
        }
        (out_dir / f"agents-{args.mode}{args.tag}.json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
