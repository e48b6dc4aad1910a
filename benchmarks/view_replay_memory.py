"""Memory of a browser tab replaying a large simulation in `heddle view`.

Simulates `--num-requests` chat requests (Llama-3.1-8B on the H100 roofline, `heddle simulate
--output-dir`, which saves the view file), serves it as `heddle view` does, and opens it in
headless Chromium (Debian's, driven by Playwright). The page then shows the whole run, plays it
for `--play-seconds`, zooms into a tenth of it and goes back to the whole run. Memory is read
while it does: the tab's renderer process (resident set, from /proc) and the JS heap (Chrome
DevTools Protocol). The page holds at most a window of buckets the server aggregated, so
neither should grow with the run's length.

    .venv/bin/python benchmarks/view_replay_memory.py --num-requests 100000
    .venv/bin/python benchmarks/view_replay_memory.py --run results/view_100k/simulate.json

In two pieces (each one job of a few minutes on a shared machine): `--simulate-only` runs the
same simulation as `heddle simulate --output-dir` (its `simulate_once` and view recorder) and
writes only the view file, not the run's JSON of every token (hundreds of MB at 100k requests,
which the view does not read); then `--run` on that view file opens it in the browser.

    .venv/bin/python benchmarks/view_replay_memory.py --num-requests 100000 --simulate-only
    .venv/bin/python benchmarks/view_replay_memory.py --run results/view_100000/simulate.view.json.gz

`--load-only --run FILE` measures the `heddle view` process alone (no browser): it loads the
file and answers what the page asks, and reports its resident set after each (run it under
`/usr/bin/time -v` for the kernel's own maximum).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from heddle.hostinfo import machine_line

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def renderer_rss_mb() -> float:
    """The largest resident set among Chromium renderer processes (one per tab), in MB."""
    largest = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"--type=renderer" not in cmdline or b"chromium" not in cmdline:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    largest = max(largest, int(line.split()[1]))
        except OSError:
            continue
    return largest / 1024


def simulate_view_only(num_requests: int, rate: float) -> None:
    """`heddle simulate --workload chat --rate R --num-requests N --model llama-3.1-8b
    --hardware h100 --output-dir results/view_N`, writing only `simulate.view.json.gz`."""
    from heddle.cli.main import build_parser
    from heddle.sim.cli import simulate_once
    from heddle.view.record import ViewRecorder

    directory = Path(f"results/view_{num_requests}")
    args = build_parser().parse_args(
        [
            "simulate", "--workload", "chat", "--rate", str(rate),
            "--num-requests", str(num_requests), "--model", "llama-3.1-8b",
            "--hardware", "h100", "--output-dir", str(directory), "--no-progress",
        ]
    )  # fmt: skip
    title = f"simulate chat @ {rate} req/s — {args.policy}, {args.model} on {args.hardware}"
    recorder = ViewRecorder(title, info={"command": "simulate", "label": args.label})
    started = time.perf_counter()
    cpu_started = time.process_time()
    _, result = simulate_once(args, args.rate, False, recorder)
    view = recorder.save(directory / f"{args.label}.view.json.gz", result.records)
    print(
        f"{len(result.records)} requests, {result.num_steps} steps simulated in "
        f"{result.wall_seconds:.0f} s wall; with the view file {time.perf_counter() - started:.0f} "
        f"s wall, {time.process_time() - cpu_started:.0f} s CPU; wrote {view} "
        f"({view.stat().st_size / 1e6:.1f} MB)",
        flush=True,
    )


def load_only(run: Path, output: str) -> None:
    """The `heddle view` process alone: load the run (as `heddle view` does) and answer what
    the page asks of it (the whole run, a window, latency, the request list, drill-downs of
    the most stalled requests, markers); its resident set after each, and at most."""
    from heddle.view.cli import load_store
    from heddle.view.pictures import pictures

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    phases: dict[str, float] = {"start": rss_mb()}
    started = time.perf_counter()
    store = load_store(str(run))
    load_seconds = time.perf_counter() - started
    phases["loaded"] = rss_mb()
    meta = store.meta()
    span = (meta["end"] or 0) - (meta["start"] or 0)
    store.steps(None, None, 1500)
    store.steps(span * 0.4, span * 0.5, 600)
    phases["windows"] = rss_mb()
    store.latency()
    phases["latency"] = rss_mb()
    listed = store.request_list("stall", 50)
    for row in listed[:5]:
        store.request(row["id"])
    phases["drill-downs"] = rss_mb()
    store.markers(span * 0.4, span * 0.5)
    pictures(store)
    phases["markers and pictures"] = rss_mb()
    summary = {
        "machine": machine_line(),
        "run": str(run),
        "num_steps": meta["num_steps"],
        "num_requests": meta["num_requests"],
        "num_events": meta["num_events"],
        "load_seconds": load_seconds,
        "rss_mb": phases,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(
        f"{run}: {meta['num_requests']} requests, {meta['num_steps']} steps, "
        f"{meta['num_events']} events; loaded in {load_seconds:.1f} s; resident "
        + ", ".join(f"{k} {v:.0f} MB" for k, v in phases.items())
        + f"; at most {summary['max_rss_mb']:.0f} MB",
        flush=True,
    )
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(summary, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--run", default=None, help="a saved run to open instead of simulating")
    parser.add_argument("--play-seconds", type=float, default=20.0)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--output", default="results/view_replay_memory.json")
    parser.add_argument(
        "--load-only",
        action="store_true",
        help="load --run as `heddle view` does, ask it what the page asks, report the resident set",
    )
    parser.add_argument(
        "--simulate-only", action="store_true", help="write the run's view file and stop"
    )
    args = parser.parse_args()

    if args.simulate_only:
        simulate_view_only(args.num_requests, args.rate)
        return
    if args.load_only:
        if args.run is None:
            raise SystemExit("--load-only needs --run")
        load_only(Path(args.run), args.output)
        return
    if args.run is None:
        directory = Path(f"results/view_{args.num_requests}")
        command = [
            sys.executable, "-m", "heddle", "simulate", "--workload", "chat",
            "--rate", str(args.rate), "--num-requests", str(args.num_requests),
            "--model", "llama-3.1-8b", "--hardware", "h100",
            "--output-dir", str(directory), "--no-progress",
        ]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(command, check=True)
        print(f"simulated in {time.perf_counter() - started:.0f} s", flush=True)
        run = directory / "simulate.json"
    else:
        run = Path(args.run)

    import uvicorn
    from playwright.sync_api import sync_playwright

    from heddle.view.cli import build_view_app, load_store
    from heddle.view.saved import SUFFIX, view_path_for

    started = time.perf_counter()
    store = load_store(str(run))
    load_seconds = time.perf_counter() - started
    meta = store.meta()
    view_file = run if run.name.endswith(SUFFIX) else view_path_for(run)
    print(
        f"loaded {meta['num_steps']} steps, {meta['num_requests']} requests, "
        f"{meta['num_events']} events in {load_seconds:.1f} s "
        f"({view_file.stat().st_size / 1e6:.1f} MB file)",
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(build_view_app(store), port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/dashboard"
    samples: list[dict[str, Any]] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")

            def sample(phase: str) -> None:
                metrics = {
                    m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]
                }
                samples.append(
                    {
                        "phase": phase,
                        "renderer_rss_mb": renderer_rss_mb(),
                        "js_heap_used_mb": metrics.get("JSHeapUsedSize", 0) / 2**20,
                        "js_heap_total_mb": metrics.get("JSHeapTotalSize", 0) / 2**20,
                        "steps_drawn": page.evaluate("() => window.heddleView.stats.stepsDrawn"),
                    }
                )
                print(samples[-1], flush=True)

            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_function(
                "window.heddleView && window.heddleView.ready.all", timeout=120_000
            )
            first_draw = time.perf_counter() - t0
            sample("whole run")
            page.click("#btn-play")
            deadline = time.monotonic() + args.play_seconds
            while time.monotonic() < deadline:
                page.wait_for_timeout(2000)
                sample("playing")
            page.click("#btn-play")
            page.wait_for_timeout(500)
            span = (meta["end"] or 0) - (meta["start"] or 0)
            page.evaluate(
                f"() => window.heddleView.state.window = {{start: {span * 0.45}, end: {span * 0.55}}}"
            )
            page.click("#btn-all")
            page.wait_for_timeout(1000)
            sample("whole run again")
            errors = page.evaluate("() => window.heddleView.stats.errors")
            browser.close()
    finally:
        server.should_exit = True
        thread.join(30)
    summary = {
        "machine": machine_line(),
        "run": str(run),
        "num_steps": meta["num_steps"],
        "num_requests": meta["num_requests"],
        "num_events": meta["num_events"],
        "view_file_mb": view_file.stat().st_size / 1e6,
        "load_seconds": load_seconds,
        "first_draw_seconds": first_draw,
        "server_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tab_rss_mb_max": max(s["renderer_rss_mb"] for s in samples),
        "js_heap_used_mb_max": max(s["js_heap_used_mb"] for s in samples),
        "page_errors": errors,
        "samples": samples,
    }
    print(
        f"{meta['num_requests']} requests, {meta['num_steps']} steps: tab (renderer) RSS max "
        f"{summary['tab_rss_mb_max']:.0f} MB, JS heap max {summary['js_heap_used_mb_max']:.1f} MB; "
        f"first draw {first_draw:.1f} s; `heddle view` process max RSS "
        f"{summary['server_max_rss_mb']:.0f} MB, load {load_seconds:.1f} s"
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
