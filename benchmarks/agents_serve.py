"""Agent programs against `heddle serve` on the real engine: fcfs + LRU prefix caching (what
engines do today) vs heddle's retention (+ plas), the same load, through the agent load client.

For each configuration the script starts `heddle serve` on the embedded model (SmolLM2-135M,
CPU) on a free port with that configuration and the same KV pool (all servers start first; an
idle one sleeps), then for each repeat runs the agent load client (`heddle.bench.client.
run_bench`: multi-turn chat programs, tool waits on the wall clock, session fields) against each
configuration in turn with the same workload, seed and arrival rate, and prints per-program
completion time (mean, p50, p95), per-call TTFT, programs per second and the prefix-cache hit
rate the server reported, then the medians over repeats and the side-by-side ratios against the
first configuration. After every run it closes every session the run used and checks that the
server holds no KV block (`kv_blocks_used` of /health once idle; exit status 1 if any leaked).

    python benchmarks/agents_serve.py --workload agent-swe --request-rate 1.0 --num-programs 60 \\
        --num-blocks 192 --max-num-seqs 8 --offload-blocks 1024 --repeats 2 \\
        --workload-option length_scale=0.3 --workload-option output_mean=15 \\
        --workload-option tool_time_factor=0.3 --workload-option max_context_len=1400 \\
        --workload-option turns_mean=8 --workload-option max_turns=10 \\
        --configs fcfs:lru,plas:cost+tier --output-dir results/agents-serve

Wall-time figures: run under tools/bench, alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from heddle.bench.client import run_bench
from heddle.bench.server import wait_healthy
from heddle.hostinfo import free_port, machine_line


def start_server(
    config: str, args: argparse.Namespace, port: int, log: Any
) -> subprocess.Popen[bytes]:
    policy, retention = config.split(":")
    offload = 0
    if retention.endswith("+tier"):
        retention, offload = retention.removesuffix("+tier"), args.offload_blocks
    command = [
        sys.executable, "-m", "heddle", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--policy", policy, "--retention", retention, "--num-blocks", str(args.num_blocks),
        "--max-num-seqs", str(args.max_num_seqs), "--offload-blocks", str(offload),
        "--log-level", "warning", "--num-threads", str(args.threads),
    ]
    # Its own process group: a server stopped while it starts would leave its engine core
    # process behind (the core does not watch its parent while it loads); the group goes whole.
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(server: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    # The core may outlive the server's own exit by a moment: end what is left of the group.
    time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)


class Servers:
    """One `heddle serve` per configuration, all started before the first run (they start in
    parallel; an idle server sleeps) and stopped together at the end."""

    def __init__(self, configs: list[str], args: argparse.Namespace) -> None:
        self.urls: dict[str, str] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        logs: list[tuple[subprocess.Popen[bytes], str, Path]] = []
        try:
            for config in configs:
                port = free_port()
                log_path = Path(tempfile.gettempdir()) / f"agents-serve-{port}.log"
                with log_path.open("wb") as log:
                    server = start_server(config, args, port, log)
                self.procs.append(server)
                self.urls[config] = f"http://127.0.0.1:{port}"
                logs.append((server, self.urls[config], log_path))
            start = time.monotonic()
            for server, url, log_path in logs:
                try:
                    wait_healthy(server, url,
                                 args.start_timeout - (time.monotonic() - start), log_path)
                except RuntimeError as e:
                    raise SystemExit(str(e)) from None
            print(f"# {len(configs)} servers healthy after {time.monotonic() - start:.0f} s",
                  flush=True)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in self.procs:
            stop(server)


def run_config(
    config: str, url: str, seed: int, args: argparse.Namespace, options: dict[str, Any]
) -> dict[str, Any]:
    before = httpx.get(f"{url}/health", timeout=10).json()["engine"]
    start = time.perf_counter()
    with EngineSampler(url) as sampler:
        bench_start = time.perf_counter()
        result = run_bench(
            url,
            args.workload,
            request_rate=args.request_rate,
            num_requests=args.num_programs,
            seed=seed,
            max_duration=args.max_duration,
            workload_options=options,
        )
    wall = time.perf_counter() - start
    leaked, health = leak_check(url, session_ids(args.workload, seed, args, options))
    programs = result.programs
    assert programs is not None
    records = [
        {"arrival": r.arrival_time, "completion": r.completion_time, "calls": r.num_calls}
        for r in result.program_records
    ]
    return {
        "config": config,
        "seed": seed,
        "programs": programs.to_dict(),
        "errors": len(result.errors),
        "error_samples": sorted(set(result.errors.values()))[:3],
        "wall_seconds": wall,
        "kv_blocks_used_at_end": leaked,
        "engine_at_end": health,
        "preemptions": health["num_preemptions_total"] - before["num_preemptions_total"],
        "program_records": records,
        "engine_samples": sampler.samples,
        "pressure": pressure(sampler.samples, records, args.num_blocks),
        "sample_offset": bench_start - sampler.started,
    }


def as_point(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A run as one point of `agents_sessions.py`'s JSON, so that its `windows` and `horizon`
    judge a real run by its queue like a simulated one: the programs by arrival (seconds since
    the first arrival; completion time, None if cut by --max-duration) and the /health samples
    as (seconds since the first arrival, pool share used, requests waiting, running). The
    workload is labelled "(real)" so a real run is never paired with a simulated one."""
    policy, retention = row["config"].split(":")
    records = sorted(row["program_records"], key=lambda r: r["arrival"])
    done = [r["completion"] for r in records if r["completion"] is not None]
    p = row["programs"]["completion_time"]
    # The samples' clock starts just before the load client's: move them to its first arrival.
    shift = row.get("sample_offset", 0.0)
    return {
        "workload": f"{args.workload} (real)",
        "load": args.request_rate,
        "policy": policy,
        "retention": retention,
        "seed": row["seed"],
        "num_programs": len(records),
        "completed": len(done),
        "pct_mean": p["mean"],
        "pct_p95": p["p95"],
        "tokens_recomputed": None,
        "program_series": [(r["arrival"], r["completion"], 0.0) for r in records],
        "queue_series": [(t - shift, used / args.num_blocks, waiting, running)
                         for t, used, running, waiting in row["engine_samples"]],
    }


class EngineSampler:
    """Samples the server's /health every `interval` seconds while a run goes on (seconds since
    the run's start, blocks used (parked included), requests running / waiting): whether KV
    binds is read from these, not assumed."""

    def __init__(self, url: str, interval: float = 0.5) -> None:
        self.url, self.interval = url, interval
        self.samples: list[list[float]] = []
        self.started = time.perf_counter()  # the samples' clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = self.started
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while not self._stop.is_set():
                try:
                    engine = client.get("/health").json()["engine"]
                except (httpx.HTTPError, KeyError, ValueError):
                    engine = None
                if engine is not None:
                    self.samples.append([
                        round(time.perf_counter() - t0, 3), engine["kv_blocks_used"],
                        engine["num_running"], engine["num_waiting"],
                    ])
                self._stop.wait(self.interval)

    def __enter__(self) -> EngineSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def pressure(
    samples: list[list[float]], records: list[dict[str, Any]], num_blocks: int
) -> dict[str, Any]:
    """What the samples say about the run, over the arrival window (first to last program
    arrival): the pool's mean use, the share of samples with >= 90% of it used, with a request
    waiting, and with both; and mean completion time of the first and the second half of the
    programs by arrival (a queue that grows through the run makes the second half slower)."""
    arrivals = sorted(r["arrival"] for r in records)
    if not samples or not arrivals:
        return {}
    window = [s for s in samples if arrivals[0] <= s[0] <= arrivals[-1]] or samples
    full = [s[1] >= 0.9 * num_blocks for s in window]
    waiting = [s[3] > 0 for s in window]
    ordered = sorted(records, key=lambda r: r["arrival"])
    half = len(ordered) // 2

    def mean_pct(part: list[dict[str, Any]]) -> float | None:
        done = [r["completion"] for r in part if r["completion"] is not None]
        return statistics.fmean(done) if done else None

    return {
        "mean_used_share": statistics.fmean(s[1] for s in window) / num_blocks,
        "full_share": statistics.fmean(full),
        "waiting_share": statistics.fmean(waiting),
        "full_and_waiting_share": statistics.fmean(
            a and b for a, b in zip(full, waiting, strict=True)
        ),
        "mean_waiting": statistics.fmean(s[3] for s in window),
        "pct_first_half": mean_pct(ordered[:half]),
        "pct_second_half": mean_pct(ordered[half:]),
    }


def session_ids(
    workload: str, seed: int, args: argparse.Namespace, options: dict[str, Any]
) -> list[str]:
    """Every program's and sub-agent's session id (the load client uses the program id)."""
    from heddle.workloads import get_workload

    programs = get_workload(
        workload, seed=seed, num_requests=args.num_programs, rate=args.request_rate,
        **options,
    ).programs
    ids: list[str] = []
    stack = list(programs)
    while stack:
        program = stack.pop()
        ids.append(program.program_id)
        stack.extend(child for call in program.calls for child in call.subagents)
    return ids


def leak_check(url: str, sessions: list[str], timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
    """KV blocks still held once the run is over: closes every session the run may have left
    open (a program cut by --max-duration; 404 for those its last turn closed), waits for the
    engine to be idle and returns its used blocks (0: nothing leaked) and its last stats.
    Blocks the prefix cache still holds for reuse are free, not used."""
    with httpx.Client(base_url=url, timeout=10) as client:
        for session in sessions:
            answer = client.delete(f"/v1/sessions/{session}")
            if answer.status_code not in (200, 404):
                raise SystemExit(f"DELETE /v1/sessions/{session}: {answer.status_code} "
                                 f"{answer.text[:200]}")
        deadline = time.monotonic() + timeout
        while True:
            engine = client.get("/health").json()["engine"]
            idle = not engine["num_running"] and not engine["num_waiting"]
            if (idle and not engine["kv_blocks_used"]) or time.monotonic() > deadline:
                return int(engine["kv_blocks_used"]), engine
            time.sleep(0.2)


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(row: dict[str, Any]) -> str:
    p = row["programs"]
    c, t = p["completion_time"], p["turn_ttft"]
    return (
        f"{row['config']} (repeat {row['repeat']}): programs {p['num_completed']}/"
        f"{p['num_programs']} (failed {p['num_failed']}, errors {row['errors']}); completion "
        f"mean {_f(c['mean'])} s, p50 {_f(c['p50'])}, p95 {_f(c['p95'])}; turn TTFT mean "
        f"{_f(t['mean'], 3)} s, p95 {_f(t['p95'], 3)}; {p['program_throughput']:.3f} programs/s;"
        f" cached {_f(p['cache_hit_rate'], 3)}; {row['wall_seconds']:.0f} s; leaked KV blocks "
        f"{row['kv_blocks_used_at_end']}"
        + (f"\n  pressure over the arrivals: pool {q['mean_used_share']:.0%} used on average, "
           f">= 90% used {q['full_share']:.0%} of the time, a request waiting "
           f"{q['waiting_share']:.0%} (both {q['full_and_waiting_share']:.0%}; mean "
           f"{q['mean_waiting']:.1f} waiting); preemptions {row['preemptions']}; PCT first / "
           f"second half by arrival {_f(q['pct_first_half'])} / {_f(q['pct_second_half'])} s"
           if (q := row.get("pressure")) else "")
    )


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """Per configuration the median over repeats of mean and p95 completion time, and the
    ratios of the first configuration's to each other's, per repeat and of the medians."""
    configs = list(dict.fromkeys(row["config"] for row in rows))
    by: dict[str, list[dict[str, Any]]] = {c: [r for r in rows if r["config"] == c] for c in configs}

    def stat(row: dict[str, Any], name: str) -> float | None:
        value = row["programs"]["completion_time"][name]
        return float(value) if value else None

    lines = []
    for config in configs:
        means = [m for r in by[config] if (m := stat(r, "mean")) is not None]
        p95s = [m for r in by[config] if (m := stat(r, "p95")) is not None]
        if means and p95s:
            lines.append(f"{config}: median over {len(means)} repeats: mean "
                         f"{statistics.median(means):.2f} s, p95 {statistics.median(p95s):.2f} s")
    base = configs[0]
    for config in configs[1:]:
        per = []
        for a, b in zip(by[base], by[config], strict=False):
            ma, mb, pa, pb = stat(a, "mean"), stat(b, "mean"), stat(a, "p95"), stat(b, "p95")
            if ma and mb and pa and pb:
                per.append((ma / mb, pa / pb))
        if per:
            lines.append(
                f"{base} / {config}: mean {statistics.median(m for m, _ in per):.2f}x, p95 "
                f"{statistics.median(p for _, p in per):.2f}x (median of {len(per)} side-by-side"
                f" repeats: {', '.join(f'{m:.2f}x' for m, _ in per)})"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="agent-swe")
    parser.add_argument("--configs", default="fcfs:lru,plas:cost+tier")
    parser.add_argument("--request-rate", type=float, default=0.2, help="programs/s")
    parser.add_argument("--num-programs", type=int, default=12)
    parser.add_argument("--num-blocks", type=int, default=192)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--offload-blocks", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of every configuration, alternated side by side")
    parser.add_argument("--max-duration", type=float, default=150.0, help="seconds per config")
    parser.add_argument("--start-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--warmup-programs", type=int, default=0,
                        help="programs (seed 1000, not recorded) run on every server first: a "
                             "fresh server's first steps are slow")
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    if args.warmup_programs < 0 or args.num_programs < 1:
        parser.error("--warmup-programs must be >= 0 and --num-programs >= 1")
    options: dict[str, Any] = {}
    for item in args.workload_option:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    print(f"# {' '.join(sys.argv)}\n# machine: {machine_line()}", flush=True)
    rows: list[dict[str, Any]] = []
    out = Path(args.output_dir) if args.output_dir else None
    configs = args.configs.split(",")
    # A timeout's SIGTERM ends the run through `finally`: the servers are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers = Servers(configs, args)
    try:
        if args.warmup_programs:
            for config in configs:
                warm = argparse.Namespace(**{**vars(args), "num_programs": args.warmup_programs})
                row = run_config(config, servers.urls[config], 1000, warm, options)
                print(f"# warm-up of {config}: {row['programs']['num_completed']} programs in "
                      f"{row['wall_seconds']:.0f} s, leaked KV blocks "
                      f"{row['kv_blocks_used_at_end']}", flush=True)
                if row["kv_blocks_used_at_end"]:
                    raise SystemExit(f"{config}: the warm-up leaked KV blocks")
        # Repeat r runs every configuration on the workload drawn with seed + r, one after the
        # other, on the same servers (a closed session's id may be used again).
        for repeat in range(args.repeats):
            for config in configs:
                row = run_config(config, servers.urls[config], args.seed + repeat, args, options)
                row["repeat"] = repeat
                rows.append(row)
                if out is not None:  # after each run: a run cut short keeps what it has
                    out.mkdir(parents=True, exist_ok=True)
                    data = {"command": " ".join(sys.argv), "machine": machine_line(),
                            "setup": f"real engine, {args.num_blocks} KV blocks",
                            "rows": rows, "points": [as_point(r, args) for r in rows]}
                    path = out / f"agents-serve-{args.workload}.json"
                    path.write_text(json.dumps(data, indent=1))
                print(report(row), flush=True)
    finally:
        servers.stop()
    for line in ratios(rows):
        print(line)
    for row in rows:
        if row["errors"] or row["programs"]["num_failed"]:
            print(f"warning: {row['config']}: {row['errors']} errors, "
                  f"{row['programs']['num_failed']} failed programs")
    leaked = [row for row in rows if row["kv_blocks_used_at_end"]]
    print(f"leaked KV blocks after every run: "
          f"{'none' if not leaked else ', '.join(str(r['kv_blocks_used_at_end']) for r in leaked)}")
    if leaked:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
