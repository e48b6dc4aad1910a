"""The cost of decision events on the simulator's hot path: the same simulation with the ring
buffer on and off, side by side.

Chat requests on the Llama-3.1-8B/H100 roofline arrive (Poisson) at `--load` x the saturation
throughput (as in benchmarks/sim_speed.py), once with `decision_events` at its default size and
once with it off (0), alternating `--repeats` times. Reports the median wall time of each, the
relative cost (the ratio of the medians, and the median of each repeat's on/off pair), the
process CPU time beside the wall time, the cost per step, and how many events a run logs. No
step stats and no view probe: only what every run pays. Several `--num-requests` in one
command run one after the other (is the cost per step the same at every length?).

With `--parallel`, each repeat runs its two arms at the same time, one pinned to each of two
CPUs (the CPUs swapped every repeat), each in a process of its own: both arms see the same
moment of the machine (its drift cancels within a pair) and a pair takes the time of one run.
With `--fresh`, one arm at a time, each run in a new process. Every pair's arms must report
the same schedule digest (the same decisions), or the script stops.

`--instructions` (untimed, any machine with valgrind: Debian `apt-get install -y valgrind`)
counts each arm's instructions under callgrind at two or more small lengths, both arms at
once: the count does not move with the machine's load, and the difference between two
lengths leaves out start-up. `--cache-sim` adds callgrind's simulated caches and branch
predictor (about twice as slow).

    /work/tools/bench .venv/bin/python benchmarks/events_cost.py --num-requests 10000 20000
    /work/tools/bench .venv/bin/python benchmarks/events_cost.py --parallel --repeats 7 \
        --num-requests 10000 20000 40000
    /work/tools/bench .venv/bin/python benchmarks/events_cost.py --probe --num-requests 5000
    .venv/bin/python benchmarks/events_cost.py --from-log results/events_cost.log   # a cut run
    /work/tools/bg results/instr.log .venv/bin/python benchmarks/events_cost.py --instructions \
        --num-requests 1000 2000     # ~4 minutes on 2 free cores

`--probe` adds a third arm (one at a time): events on and the view's probe as an engine core
runs it, its step row and new events MessagePack-encoded after every step.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.events import DEFAULT_CAPACITY
from heddle.hostinfo import machine_line
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.workloads import get_workload

if TYPE_CHECKING:
    from heddle.core.outputs import SchedulerOutput
    from heddle.engine.engine import Engine

ARMS = ("on", "off", "probe")


class GCTimer:
    """Seconds the garbage collector ran while installed (its passes are part of the cost)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> GCTimer:
        gc.collect()
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def run(
    num_requests: int, rate: float, seed: int, events: int, probe: bool = False
) -> tuple[float, float, int, int, str]:
    """(wall seconds, process CPU seconds, steps, events logged, a digest of the schedule: every
    request's first-scheduled and finish times, preemptions and cached tokens, so that two arms
    that made the same decisions have the same digest) of one simulation. `probe`:
    also the view's probe, as an engine core runs it (`heddle.view.live.view_source`), its
    step rows and new events drained and encoded for the channel after every step, whether or
    not a page is open."""
    config = EngineConfig(
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=8192, max_num_seqs=256, decision_events=events
        ),
    )
    workload = get_workload("chat", seed=seed, num_requests=num_requests, rate=rate)
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100", record_steps=False)
    if probe:
        install_probe(engine)
    cpu_start = time.process_time()
    result = simulate(workload, engine)
    cpu = time.process_time() - cpu_start
    log = result.engine.scheduler.events if result.engine is not None else None
    digest = hashlib.sha256(
        repr(
            [
                (
                    r.request_id,
                    r.first_scheduled_time,
                    r.finish_time,
                    r.num_preemptions,
                    r.num_cached_tokens,
                    r.stall_time,
                )
                for r in result.records
            ]
        ).encode()
    ).hexdigest()[:16]
    return result.wall_seconds, cpu, result.num_steps, 0 if log is None else log.num_events, digest


def install_probe(engine: Engine) -> None:
    """What an engine core with the view does after each step: the probe's row and events
    (`view_source`), drained and MessagePack-encoded as the core's step batch carries them."""
    import msgspec

    from heddle.view.live import view_source

    drain = view_source(engine)
    probe = engine.step_observer
    assert probe is not None
    encode = msgspec.msgpack.encode

    def observe(output: SchedulerOutput, start: float, duration: float) -> None:
        probe(output, start, duration)
        encode(drain())

    engine.step_observer = observe


def counts(num_requests: int, rate: float, seed: int) -> dict[str, object]:
    """What the log is asked to do in one run (events on): the work behind its cost. These
    are counts on the simulator's virtual clock, the same on any machine."""
    config = EngineConfig(
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256),
    )
    workload = get_workload("chat", seed=seed, num_requests=num_requests, rate=rate)
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100", record_steps=False)
    result = simulate(workload, engine)
    assert result.engine is not None
    log = result.engine.scheduler.events
    assert log is not None
    by_kind: dict[str, int] = {}
    for event in log:  # the newest `capacity` events
        name = type(event).__name__
        by_kind[name] = by_kind.get(name, 0) + 1
    steps = result.num_steps
    evictions = log._num_evictions
    out: dict[str, object] = {
        "num_requests": num_requests,
        "num_steps": steps,
        "num_events": log.num_events,
        "eviction_events": evictions,
        "other_events": log.num_events - evictions,
        "evicted_blocks": log.num_evicted_blocks,
        "kept_events_by_kind": by_kind,
        "per_step": {
            "evicted_blocks": log.num_evicted_blocks / steps,
            "eviction_events": evictions / steps,
            "other_events": (log.num_events - evictions) / steps,
            "requests": num_requests / steps,
        },
    }
    print(json.dumps(out), flush=True)
    return out


def one_arm(num_requests: int, rate: float, seed: int, arm: str) -> dict[str, Any]:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with GCTimer() as collector:
        wall, cpu, steps, logged, digest = run(
            num_requests, rate, seed, 0 if arm == "off" else DEFAULT_CAPACITY, arm == "probe"
        )
    return {
        "wall": wall,
        "cpu": cpu,
        "gc": collector.seconds,
        "steps": steps,
        "events": logged,
        "digest": digest,
        # Page faults of the run (the kernel's time, which an instruction count leaves out).
        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
    }


def _spawn_arm(num_requests: int, rate: float, seed: int, arm: str, cpu: int | None = None) -> Any:
    """One arm in a process of its own (pinned to `cpu` if given); `_arm_result` reads it."""
    pin = "" if cpu is None else f"os.sched_setaffinity(0, {{{cpu}}}); "
    code = (
        "import json, os, sys; sys.path.insert(0, os.path.dirname(sys.argv[1])); "
        f"{pin}from events_cost import one_arm; "
        f"print(json.dumps(one_arm({num_requests}, {rate!r}, {seed}, {arm!r})))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, os.path.abspath(__file__)], stdout=subprocess.PIPE
    )


def _arm_results(procs: Mapping[str, tuple[int | None, Any]]) -> dict[str, dict]:
    out = {}
    try:
        for arm, (cpu, proc) in procs.items():
            stdout, _ = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"the {arm} arm failed (exit {proc.returncode})")
            out[arm] = json.loads(stdout.decode().strip().splitlines()[-1])
            if cpu is not None:
                out[arm]["cpu_id"] = cpu
    finally:
        for _, proc in procs.values():  # stopped early (a timeout's SIGTERM): no arm left behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def parallel_pair(num_requests: int, rate: float, seed: int, swap: bool) -> dict[str, dict]:
    """Both arms at once, each in its own process pinned to one CPU (`swap`: the other way)."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        raise SystemExit("--parallel needs two CPUs")
    procs = {
        arm: (cpu, _spawn_arm(num_requests, rate, seed, arm, cpu))
        for arm, cpu in zip(("on", "off"), cpus[::-1] if swap else cpus, strict=True)
    }
    return _arm_results(procs)


def fresh_arm(num_requests: int, rate: float, seed: int, arm: str) -> dict[str, Any]:
    """One arm in a fresh process (`--fresh`): no arm runs on the heap another one left."""
    return _arm_results({arm: (None, _spawn_arm(num_requests, rate, seed, arm))})[arm]


def measure(
    num_requests: int,
    rate: float,
    seed: int,
    repeats: int,
    parallel: bool = False,
    probe: bool = False,
    fresh: bool = False,
) -> dict[str, object]:
    """Events on and off at one length: one arm after the other, in an order that changes every
    repeat (`fresh`: each run in a process of its own), or (`parallel`) at the same time on two
    CPUs, swapped every repeat. `probe`: a
    third arm (one at a time only), events on with the view's probe as an engine core runs it."""
    arms = ["on", "off", "probe"] if probe else ["on", "off"]
    walls: dict[str, list[float]] = {arm: [] for arm in arms}
    cpus: dict[str, list[float]] = {arm: [] for arm in arms}
    gcs: dict[str, list[float]] = {arm: [] for arm in arms}
    steps = num_events = 0
    for i in range(repeats):
        if parallel:
            results = parallel_pair(num_requests, rate, seed, swap=i % 2 == 1)
        else:
            shift = (i // 2) % len(arms)
            order = arms[shift:] + arms[:shift]
            if i % 2:
                order.reverse()
            run_arm = fresh_arm if fresh else one_arm
            results = {arm: run_arm(num_requests, rate, seed, arm) for arm in order}
        if len({r["digest"] for r in results.values()}) != 1:
            raise SystemExit(f"{num_requests} requests: the arms scheduled differently: {results}")
        for arm, r in results.items():
            walls[arm].append(r["wall"])
            cpus[arm].append(r["cpu"])
            gcs[arm].append(r["gc"])
            steps = int(r["steps"])
            num_events = max(num_events, int(r["events"]))
            where = f" on CPU {r['cpu_id']}" if "cpu_id" in r else ""
            print(
                f"  {num_requests} requests, events {arm:>5}{where}: {r['wall']:6.2f} s wall, "
                f"{r['cpu']:6.2f} s CPU ({r['gc']:.2f} s in the garbage collector), {steps} "
                f"steps, {int(r['events'])} events",
                flush=True,
            )
    return summarize(num_requests, walls, cpus, gcs, steps, num_events, parallel)


def summarize(
    num_requests: int,
    walls: dict[str, list[float]],
    cpus: dict[str, list[float]],
    gcs: dict[str, list[float]],
    steps: int,
    num_events: int,
    parallel: bool,
) -> dict[str, object]:
    """The medians of the arms at one length (pairs: the i-th run of each arm)."""
    pairs = min(len(walls["on"]), len(walls["off"]))
    if pairs == 0:
        raise SystemExit(f"{num_requests} requests: no pair of an on and an off run")
    walls = {arm: values[:pairs] for arm, values in walls.items()}
    cpus = {arm: values[:pairs] for arm, values in cpus.items()}
    gcs = {arm: values[:pairs] for arm, values in gcs.items()}
    probe = len(walls.get("probe", ())) == pairs
    on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
    paired = statistics.median(a / b - 1 for a, b in zip(walls["on"], walls["off"], strict=True))
    cpu_on, cpu_off = statistics.median(cpus["on"]), statistics.median(cpus["off"])
    paired_cpu = statistics.median(a / b - 1 for a, b in zip(cpus["on"], cpus["off"], strict=True))
    summary: dict[str, object] = {
        "num_requests": num_requests,
        "parallel": parallel,
        "num_pairs": pairs,
        "num_steps": steps,
        "num_events": num_events,
        "wall_on": walls["on"],
        "wall_off": walls["off"],
        "cpu_on": cpus["on"],
        "cpu_off": cpus["off"],
        "gc_on": gcs["on"],
        "gc_off": gcs["off"],
        "median_on": on,
        "median_off": off,
        "overhead": on / off - 1,
        "overhead_paired": paired,
        "overhead_cpu": cpu_on / cpu_off - 1,
        "overhead_cpu_paired": paired_cpu,
        "pairs": [a / b - 1 for a, b in zip(walls["on"], walls["off"], strict=True)],
        "cost_per_step_us": 1e6 * (on - off) / steps,
        "step_wall_us": 1e6 * off / steps,
    }
    if probe:
        with_probe = statistics.median(walls["probe"])
        summary.update(
            wall_probe=walls["probe"],
            cpu_probe=cpus["probe"],
            gc_probe=gcs["probe"],
            median_probe=with_probe,
            overhead_probe=with_probe / off - 1,
            overhead_probe_paired=statistics.median(
                a / b - 1 for a, b in zip(walls["probe"], walls["off"], strict=True)
            ),
            probe_cost_per_step_us=1e6 * (with_probe - off) / steps,
        )
        print(
            f"{num_requests} requests: with the view's probe (events on, rows and events encoded "
            f"every step) median wall {with_probe:.2f} s: {100 * (with_probe / off - 1):+.2f}% "
            f"against off, {1e6 * (with_probe - off) / steps:.1f} us per step",
            flush=True,
        )
    print(
        f"{num_requests} requests: median wall on {on:.2f} s, off {off:.2f} s: decision events "
        f"cost {100 * (on / off - 1):+.2f}% (median of the pairs {100 * paired:+.2f}%; CPU time "
        f"{100 * (cpu_on / cpu_off - 1):+.2f}%, pairs {100 * paired_cpu:+.2f}%), "
        f"{1e6 * (on - off) / steps:.2f} us per step of "
        f"{1e6 * off / steps:.0f} us; {num_events} events logged; {pairs} pairs",
        flush=True,
    )
    return summary


CALLGRIND_TOTALS = re.compile(r"^(?:totals|summary): (\d+)", re.M)
CACHE_EVENTS = (
    *("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw"),
    *("Bc", "Bcm", "Bi", "Bim"),  # conditional and indirect branches, and their mispredictions
)


def start_count(
    num_requests: int, rate: float, seed: int, arm: str, out_dir: Path, cache_sim: bool = False
) -> tuple[subprocess.Popen[bytes], Path, bool]:
    """Start one arm's run under valgrind's callgrind (`collect_count` waits for it): the
    instructions the whole process executed
    (start-up included; `instructions` subtracts two lengths to leave it out), with
    PYTHONHASHSEED fixed so that a run is the same instructions every time. `cache_sim`: also
    callgrind's simulated caches (first-level and last-level misses) and branch predictor
    (conditional and indirect mispredictions); about twice as slow."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit(
            "--instructions needs valgrind (Debian: apt-get install -y valgrind); not found on PATH"
        )
    out_file = out_dir / f"callgrind.{arm}.{num_requests}.out"
    command = [
        valgrind,
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        *(["--cache-sim=yes", "--branch-sim=yes"] if cache_sim else []),
        sys.executable,
        os.path.abspath(__file__),
        "--one",
        arm,
        "--rate",
        repr(rate),
        "--seed",
        str(seed),
        "--num-requests",
        str(num_requests),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, out_file, cache_sim


def collect_count(started: Any) -> dict[str, Any]:
    """The run `start_count` started: its `--one` result and its instruction count."""
    proc, out_file, cache_sim = started
    try:
        stdout, stderr = proc.communicate()
    finally:
        if proc.poll() is None:  # stopped early (a timeout's SIGTERM): no run left behind
            proc.kill()
            proc.wait()
    if proc.returncode:
        tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise SystemExit(f"a run under valgrind failed (exit {proc.returncode}): {tail}")
    result = json.loads(stdout.decode().strip().splitlines()[-1])
    text = out_file.read_text()
    totals = CALLGRIND_TOTALS.findall(text)
    if not totals:
        raise SystemExit(f"no totals in {out_file}")
    result["instructions"] = int(totals[-1])
    if cache_sim:
        events = re.search(r"^events: (.+)$", text, re.M)
        line = re.findall(r"^totals: (.+)$", text, re.M)
        if events and line:
            result["cache"] = dict(zip(events[1].split(), map(int, line[-1].split()), strict=False))
    return result


def instructions(
    lengths: list[int], rate: float, seed: int, out_dir: Path, cache_sim: bool = False
) -> dict[str, Any]:
    """The instructions each arm executes, at two (or more) lengths, the two arms of a length
    at the same time (one process each). Instruction counts do not depend on the machine's
    load, so the verdict has no noise: per step, what events add at each length; and between
    the shortest and the longest run, the extra steps' instructions (start-up, imports and
    the workload's set-up cancel), on against off."""
    if len(lengths) < 2:
        raise SystemExit("--instructions needs two --num-requests (their difference is the run)")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for n in sorted(lengths):
        started = {
            arm: start_count(n, rate, seed, arm, out_dir, cache_sim) for arm in ("on", "off")
        }
        try:
            runs[n] = {arm: collect_count(s) for arm, s in started.items()}
        finally:
            for proc, _, _ in started.values():  # one arm failed: the other is not left behind
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        on, off = runs[n]["on"], runs[n]["off"]
        if on["digest"] != off["digest"] or on["steps"] != off["steps"]:
            raise SystemExit(f"{n} requests: the arms scheduled differently ({on} vs {off})")
        print(
            f"  {n} requests, {on['steps']} steps: {on['instructions']:,} instructions on, "
            f"{off['instructions']:,} off: events add "
            f"{(on['instructions'] - off['instructions']) / on['steps']:,.0f} a step",
            flush=True,
        )
    short, long = runs[min(lengths)], runs[max(lengths)]
    steps = long["on"]["steps"] - short["on"]["steps"]
    marginal = {
        arm: (long[arm]["instructions"] - short[arm]["instructions"]) / steps
        for arm in ("on", "off")
    }
    summary: dict[str, Any] = {
        "lengths": sorted(lengths),
        "runs": {str(n): r for n, r in runs.items()},
        "steps_between": steps,
        "per_step_on": marginal["on"],
        "per_step_off": marginal["off"],
        "overhead": marginal["on"] / marginal["off"] - 1,
        "added_per_step": {
            str(n): (r["on"]["instructions"] - r["off"]["instructions"]) / r["on"]["steps"]
            for n, r in runs.items()
        },
    }
    if cache_sim:
        summary["cache_between"] = {
            arm: {
                event: (long[arm]["cache"][event] - short[arm]["cache"][event]) / steps
                for event in CACHE_EVENTS
                if event in long[arm].get("cache", {})
            }
            for arm in ("on", "off")
        }
    print(
        f"{min(lengths)} -> {max(lengths)} requests ({steps} more steps): "
        f"{marginal['on']:,.0f} instructions a step on, {marginal['off']:,.0f} off: decision "
        f"events add {100 * summary['overhead']:+.2f}% of the step's instructions",
        flush=True,
    )
    if cache_sim:
        for arm in ("on", "off"):
            print(f"  per step, {arm}: {summary['cache_between'][arm]}", flush=True)
    return summary


RUN_LINE = re.compile(
    r"^\s+(\d+) requests, events\s+(on|off|probe)(?: on CPU \d+)?: +([\d.]+) s wall, +([\d.]+) s "
    r"CPU \(([\d.]+) s in the garbage collector\), (\d+) steps, (\d+) events"
)


def from_log(path: str) -> list[dict[str, object]]:
    """The summaries of a log of this script's runs (one per length, in the order logged): for
    a run cut short (a slot's timeout) after some pairs, whose summary was never printed."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise SystemExit(f"--from-log: {e}") from None
    lengths: dict[int, dict[str, Any]] = {}
    for line in lines:
        match = RUN_LINE.match(line)
        if match is None:
            continue
        n, arm = int(match[1]), match[2]
        runs = lengths.setdefault(n, {"walls": {}, "cpus": {}, "gcs": {}, "steps": 0, "events": 0})
        runs["walls"].setdefault(arm, []).append(float(match[3]))
        runs["cpus"].setdefault(arm, []).append(float(match[4]))
        runs["gcs"].setdefault(arm, []).append(float(match[5]))
        runs["steps"] = int(match[6])
        runs["events"] = max(runs["events"], int(match[7]))
    if not lengths:
        raise SystemExit(f"--from-log: no runs of events_cost.py in {path}")
    parallel = any(" on CPU " in line for line in lines)
    return [
        summarize(n, r["walls"], r["cpus"], r["gcs"], r["steps"], r["events"], parallel)
        for n, r in lengths.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, nargs="+", default=[10_000])
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--saturation-requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="results/events_cost.json")
    parser.add_argument(
        "--rate", type=float, help="requests/s (default: --load x the saturation throughput)"
    )
    parser.add_argument(
        "--parallel", action="store_true", help="run each pair's arms at once, one per CPU"
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="one arm at a time, each run in a fresh process (not the heap of the run before)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="a third arm: events on and the view's probe as an engine core runs it",
    )
    parser.add_argument(
        "--one",
        choices=ARMS,
        help="run one arm once at the first --num-requests (for a profiler: py-spy record -- ...)",
    )
    parser.add_argument(
        "--counts",
        action="store_true",
        help="untimed: what the log records per step at each length (deterministic)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="untimed: each arm's instruction count under valgrind's callgrind at two "
        "--num-requests (small: ~50x slower), both arms at once",
    )
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="with --instructions: also callgrind's simulated cache misses and mispredictions",
    )
    parser.add_argument(
        "--from-log",
        metavar="LOG",
        help="no run: the summaries of the runs in a log of this script (one cut short)",
    )
    args = parser.parse_args()
    if args.from_log is not None:
        runs_logged = from_log(args.from_log)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"runs": runs_logged}, indent=1) + "\n")
        return
    if args.fresh and args.parallel:
        raise SystemExit("--parallel runs each arm in a process of its own already")
    if args.probe and args.parallel:
        raise SystemExit("--probe runs its arms one at a time: leave out --parallel")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop a pair's arms too

    from heddle.metrics import summarize

    if args.rate is not None:
        if not (args.rate > 0 and math.isfinite(args.rate)):
            raise SystemExit("--rate must be a positive number of requests per second")
        rate = args.rate
    else:
        config = EngineConfig(
            cache=CacheConfig(block_size=16),
            scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256),
        )
        saturated = simulate(
            get_workload(
                "chat", seed=args.seed, num_requests=args.saturation_requests, rate=math.inf
            ),
            build_sim_engine(config, model="llama-3.1-8b", hardware="h100", record_steps=False),
        )
        rate = args.load * summarize(saturated.records).overall.request_throughput
    machine = machine_line()
    print(f"{machine}; chat at {rate:.1f} req/s", flush=True)
    if args.one is not None:
        print(json.dumps(one_arm(args.num_requests[0], rate, args.seed, args.one)), flush=True)
        return
    if args.instructions:
        counted = instructions(
            args.num_requests, rate, args.seed, Path(args.output).with_suffix(""), args.cache_sim
        )
        counted.update(machine=machine, rate=rate)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(counted, indent=1) + "\n")
        return
    if args.cache_sim:
        raise SystemExit("--cache-sim goes with --instructions")
    runs: list[dict[str, object]] = []
    summary = {
        "machine": machine,
        "rate": rate,
        "repeats": args.repeats,
        "fresh": args.fresh,
        "runs": runs,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    for n in args.num_requests:  # written after each length: a cut run keeps what it measured
        if args.counts:
            runs.append(counts(n, rate, args.seed))
        else:
            runs.append(
                measure(n, rate, args.seed, args.repeats, args.parallel, args.probe, args.fresh)
            )
        Path(args.output).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
