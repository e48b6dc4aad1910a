"""The live dashboard's cost: a real `heddle serve` at 64 concurrent streams, dashboard open vs
closed, and how far behind the engine the page is.

One server (the embedded SmolLM2-135M, --max-num-seqs 64) serves alternating rounds of the
bench client (`heddle bench serve`, closed loop at --concurrency 64, fixed lengths). In "open"
rounds a headless Chromium (Debian's, driven by Playwright) has /dashboard open and following
the live stream; in "closed" rounds no page is open. Reports per-round output throughput and
mean TPOT, the median of each arm and their ratio, and the page's lag: for every redraw, the
time from the end of the oldest step it newly draws (on the engine) to the page having drawn
it, split into the step's wait in the server's store for the next stream message, the
message's way to the page, and the page's wait for and time of its redraw.

With `--isolate-cpus` (a machine of at least two CPUs) the engine core gets a CPU of its own in
both arms: its process and every thread of it pinned to the first CPU, one torch thread
(`--num-threads 1`); this script, and so everything it starts (the server's front end, the
bench client, Chromium), stays on the second. What the open dashboard then costs the engine
is what it adds to the core itself (the view probe's rows and decision events ride in every
step batch whether or not a page is open; the front end keeps them in its store and encodes
the page's stream), not the browser's redraws taking the core's CPU, as with a browser on
another machine.

    /work/tools/bench .venv/bin/python benchmarks/view_overhead.py --rounds 3
    /work/tools/bench .venv/bin/python benchmarks/view_overhead.py --rounds 5 --isolate-cpus
    .venv/bin/python benchmarks/view_overhead.py --summarize results/view_overhead.json

The verdict is written before the browser and the server are torn down, and every round as it
finishes, so a run cut short keeps what it measured (`--summarize` reads it back).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from heddle.bench.server import wait_healthy
from heddle.hostinfo import free_port, machine_line

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    """User + system CPU seconds of each process still alive, by pid."""
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes took between the two readings: a process gone by the second
    (a closed page's renderer) counts nothing, where subtracting totals made it negative."""
    return sum(after[pid] - before[pid] for pid in after if pid in before)


def server_processes(server: subprocess.Popen[bytes]) -> dict[str, list[psutil.Process]]:
    """The front end (the `heddle serve` process) and its engine core (its child)."""
    front = psutil.Process(server.pid)
    return {"front_end": [front], "core": front.children(recursive=True)}


def pin_threads(process: psutil.Process, cpus: set[int]) -> list[int]:
    """Pin every thread of `process` (sched_setaffinity on a pid sets one thread only); returns
    the thread ids that are not on `cpus` afterwards (empty when pinning took)."""
    for thread in process.threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except OSError:  # a thread that ended meanwhile
            continue
    stray = []
    for thread in process.threads():
        try:
            if os.sched_getaffinity(thread.id) != cpus:
                stray.append(thread.id)
        except OSError:
            continue
    return stray


def isolate_core(server: subprocess.Popen[bytes], core_cpu: int) -> int:
    """Move the engine core's processes (all their threads) to `core_cpu`; returns how many
    threads now run there. Raises if a thread would not move."""
    moved = 0
    for process in server_processes(server)["core"]:
        stray = pin_threads(process, {core_cpu})
        if stray:
            raise SystemExit(f"could not pin the engine core's threads {stray} to CPU {core_cpu}")
        moved += process.num_threads()
    if not moved:
        raise SystemExit("--isolate-cpus: the server has no engine core process to pin")
    return moved


def browser_processes() -> list[psutil.Process]:
    """Chromium's processes (Playwright's driver starts them under this process)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name().lower():
                found.append(child)
        except psutil.Error:
            continue
    return found


def bench_round(
    base_url: str,
    args: argparse.Namespace,
    label: str,
    out: Path,
    num_requests: int | None = None,
    output_len: int | None = None,
) -> dict[str, Any]:
    num_requests = args.num_requests if num_requests is None else num_requests
    output_len = args.output_len if output_len is None else output_len
    command = [
        sys.executable, "-m", "heddle", "bench", "serve",
        "--base-url", base_url,
        "--workload", "random",
        "--workload-option", f"input_len={args.input_len}",
        "--workload-option", f"output_len={output_len}",
        "--concurrency", str(args.concurrency),
        "--num-requests", str(num_requests),
        "--max-duration", str(args.max_duration),
        "--seed", str(args.seed),
        "--output-dir", str(out),
        "--label", label,
        "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"the bench client failed ({done.returncode}): {done.stderr[-2000:]}")
    data = json.loads((out / f"{label}.json").read_text())
    overall = data["summary"]["overall"]
    return {
        "label": label,
        "output_throughput": overall["output_throughput"],
        "tpot_mean": overall["tpot"]["mean"],
        "completed": overall["num_completed"],
        "wall_time": data["wall_time"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per arm (open, closed)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument(
        "--warmup-output-len",
        type=int,
        help="output tokens of the warm-up round's requests (default --output-len); it runs "
        "--concurrency requests, at least one full batch",
    )
    parser.add_argument("--max-duration", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--output", default="results/view_overhead.json")
    parser.add_argument(
        "--isolate-cpus",
        action="store_true",
        help="the engine core alone on the first CPU (one torch thread), everything else on "
        "the second, in both arms",
    )
    parser.add_argument(
        "--summarize",
        metavar="JSON",
        help="no run: the verdict of the rounds a (cut) run wrote to JSON (its rounds_detail)",
    )
    args = parser.parse_args()
    if args.summarize is not None:
        try:
            saved = json.loads(Path(args.summarize).read_text())
            rounds_saved = saved["rounds_detail"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(
                f"--summarize {args.summarize}: not a view_overhead.py output ({e})"
            ) from None
        summarize(
            rounds_saved,
            saved.get("lags_ms", []),
            saved.get("lag_parts_all_ms", []),
            machine=saved["machine"],
            isolate_cpus=saved.get("isolate_cpus", False),
            core_cpu=saved.get("core_cpu"),
            concurrency=saved.get("concurrency", args.concurrency),
            output=args.output,
        )
        return
    core_cpu: int | None = None
    if args.isolate_cpus:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("--isolate-cpus needs at least two CPUs")
        core_cpu, rest = cpus[0], set(cpus[1:2])
        # Everything this script starts inherits this: front end, bench client, Chromium.
        os.sched_setaffinity(0, rest)

    from playwright.sync_api import sync_playwright

    # A `timeout` that stops this script stops its server (and browser) too: SIGTERM unwinds.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "heddle", "serve", "--port", str(port), "--log-level", "warning",
         "--max-num-seqs", str(args.concurrency), "--max-num-batched-tokens", "512",
         *(["--num-threads", "1"] if args.isolate_cpus else [])],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    rounds: list[dict[str, Any]] = []
    lags: list[float] = []
    parts: list[list[float]] = []
    try:
        wait_healthy(server, base_url)
        print(f"server healthy ({time.strftime('%H:%M:%S')})", flush=True)
        if core_cpu is not None:
            threads = isolate_core(server, core_cpu)
            print(f"engine core: {threads} threads pinned to CPU {core_cpu}", flush=True)
        with sync_playwright() as playwright, tempfile.TemporaryDirectory() as tmp:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            # Warm-up round (first-step compilation, allocator), not counted.
            bench_round(
                base_url,
                args,
                "warmup",
                Path(tmp),
                num_requests=max(args.concurrency, 1),
                output_len=args.warmup_output_len,
            )
            print(f"warm-up round done ({time.strftime('%H:%M:%S')})", flush=True)
            if core_cpu is not None:  # threads the first steps started (none expected)
                isolate_core(server, core_cpu)
            for i in range(args.rounds):
                for arm in ("closed", "open") if i % 2 == 0 else ("open", "closed"):
                    page = None
                    if arm == "open":
                        page = browser.new_page(viewport={"width": 1400, "height": 1000})
                        page.goto(f"{base_url}/dashboard")
                        page.wait_for_function("window.heddleView && window.heddleView.ready.all")
                    # CPU each part took during the round (the browser's while the page is open).
                    watched = {**server_processes(server), "browser": browser_processes()}
                    before = {name: cpu_seconds(procs) for name, procs in watched.items()}
                    result = bench_round(base_url, args, f"{arm}-{i}", Path(tmp))
                    result["arm"] = arm
                    result["cpu_s"] = {
                        name: round(cpu_delta(before[name], cpu_seconds(procs)), 2)
                        for name, procs in watched.items()
                    }
                    if page is not None:
                        steps = httpx.get(f"{base_url}/health").json()["engine"]["num_steps"]
                        page.wait_for_function(
                            f"window.heddleView.stats.stepsSeen >= {steps}", timeout=10_000
                        )
                        page.wait_for_timeout(500)
                        stats = page.evaluate("() => window.heddleView.stats")
                        result["page_lags_ms"] = stats["lags"]
                        result["page_errors"] = stats["errors"]
                        lags.extend(stats["lags"])
                        parts.extend(stats["lagParts"])
                        page.close()
                    if core_cpu is not None:  # still where it was put (raises if not)
                        isolate_core(server, core_cpu)
                    rounds.append(result)
                    # A run cut short (a slot's timeout) keeps the rounds it measured.
                    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.output).write_text(
                        json.dumps(
                            {
                                "machine": machine_line(),
                                "isolate_cpus": args.isolate_cpus,
                                "core_cpu": core_cpu,
                                "concurrency": args.concurrency,
                                "partial": True,
                                "rounds_detail": rounds,
                            },
                            indent=1,
                        )
                        + "\n"
                    )
                    cpu = result["cpu_s"]
                    print(
                        f"{result['label']:>9}: {result['output_throughput']:7.1f} tok/s, "
                        f"TPOT {1000 * result['tpot_mean']:6.1f} ms, {result['completed']} done; "
                        f"CPU s: core {cpu['core']}, front end {cpu['front_end']}, "
                        f"browser {cpu['browser']}",
                        flush=True,
                    )
            # The figures first: a teardown that hangs (a browser helper paused by the bench
            # lock) or is cut by a timeout loses nothing measured.
            summarize(
                rounds,
                lags,
                parts,
                machine=machine_line(),
                isolate_cpus=args.isolate_cpus,
                core_cpu=core_cpu,
                concurrency=args.concurrency,
                output=args.output,
            )
            browser.close()
    finally:
        server.terminate()
        server.wait(60)


def summarize(
    rounds: list[dict[str, Any]],
    lags: list[float],
    parts: list[list[float]],
    *,
    machine: str,
    isolate_cpus: bool,
    core_cpu: int | None,
    concurrency: int,
    output: str,
) -> None:
    """The medians of each arm (and the page's lag, when measured): written to `output` and
    printed."""
    if not any(r["arm"] == "closed" for r in rounds) or not any(r["arm"] == "open" for r in rounds):
        raise SystemExit("no verdict: the rounds hold no pair of a closed and an open round")

    def median(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds if r["arm"] == arm)

    closed, opened = median("closed", "output_throughput"), median("open", "output_throughput")
    tpot_closed, tpot_open = median("closed", "tpot_mean"), median("open", "tpot_mean")
    lags.sort()

    def quantiles(values: list[float]) -> dict[str, float | None]:
        values = sorted(values)
        if not values:
            return {"p50": None, "p99": None, "max": None}
        return {
            "p50": values[len(values) // 2],
            "p99": values[int(0.99 * (len(values) - 1))],
            "max": values[-1],
        }

    names = ("store_wait", "delivery", "redraw")
    lag_parts = {name: quantiles([p[i] for p in parts]) for i, name in enumerate(names)}
    summary = {
        "machine": machine,
        "isolate_cpus": isolate_cpus,
        "core_cpu": core_cpu,
        "concurrency": concurrency,
        "rounds": min(sum(r["arm"] == arm for r in rounds) for arm in ("open", "closed")),
        "throughput_closed": closed,
        "throughput_open": opened,
        "slowdown": 1 - opened / closed,
        "tpot_closed": tpot_closed,
        "tpot_open": tpot_open,
        "lag_ms_p50": lags[len(lags) // 2] if lags else None,
        "lag_ms_p99": lags[int(0.99 * (len(lags) - 1))] if lags else None,
        "lag_ms_max": lags[-1] if lags else None,
        "num_lag_samples": len(lags),
        "lag_parts_ms": lag_parts,
        "cpu_s_median": {
            arm: {
                part: statistics.median(r["cpu_s"][part] for r in rounds if r["arm"] == arm)
                for part in ("core", "front_end", "browser")
            }
            for arm in ("closed", "open")
        },
        "rounds_detail": [{k: v for k, v in r.items() if k != "page_lags_ms"} for r in rounds],
        "lags_ms": lags,
        "lag_parts_all_ms": parts,
    }
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"{summary['machine']}\n"
        + (
            f"engine core alone on CPU {0 if core_cpu is None else core_cpu} (1 thread), the "
            "rest on the other\n"
            if isolate_cpus
            else ""
        )
        + f"median output throughput: closed {closed:.1f} tok/s, open "
        f"{opened:.1f} tok/s ({100 * summary['slowdown']:+.2f}% slower with the dashboard open); "
        f"TPOT {1000 * tpot_closed:.1f} vs {1000 * tpot_open:.1f} ms\n"
        + (
            f"page lag behind the engine: p50 {summary['lag_ms_p50']:.0f} ms, "
            f"p99 {summary['lag_ms_p99']:.0f} ms, max {summary['lag_ms_max']:.0f} ms "
            f"({len(lags)} updates)\n  of which "
            + "; ".join(
                f"{name.replace('_', ' ')} p50 {q['p50']:.0f} / p99 {q['p99']:.0f} ms"
                for name, q in lag_parts.items()
                if q["p50"] is not None
            )
            + "\n"
            if lags
            else "page lag: not in these rounds\n"
        )
        + "CPU seconds per round (median), closed / open: "
        + ", ".join(
            f"{part} {summary['cpu_s_median']['closed'][part]:.1f} / "
            f"{summary['cpu_s_median']['open'][part]:.1f}"
            for part in ("core", "front_end", "browser")
        )
    )


if __name__ == "__main__":
    main()
