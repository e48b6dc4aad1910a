"""Agent programs against `heddle serve` on the real engine: fcfs + LRU prefix caching (what
engines do today) vs heddle's retention (+ plas), the same load, through the agent load client.

For each configuration the script starts `heddle serve` on the embedded model (SmolLM2-135M,
CPU) on a free port with that configuration and the same KV pool, runs the agent load client
(`heddle.bench.client.run_bench`: multi-turn chat programs, tool waits, session fields) with the
same workload, seed and arrival rate, stops the server, and prints per-program completion time
(mean, p50, p95), per-call TTFT, programs per second and the prefix-cache hit rate the server
reported, then the ratios against the first configuration.

    python benchmarks/agents_serve.py --workload agent-bfcl --request-rate 0.5 \\
        --num-programs 12 --num-blocks 96 --workload-option length_scale=0.1 \\
        --configs fcfs:lru,plas:cost --output-dir results/agents-serve

Wall-time figures: run under tools/bench, alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from heddle.bench.client import run_bench
from heddle.hostinfo import free_port


def machine() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = next(line.split(":", 1)[1].strip() for line in info.splitlines()
                    if "model name" in line)
        present = set(next(line for line in info.splitlines()
                           if line.startswith("flags")).split())
        flags = " ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_int8")
                         if f in present)
    except (OSError, StopIteration):
        name, flags = platform.processor(), ""
    return f"{name}, {os.cpu_count()} cores ({flags})"


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
        "--log-level", "warning",
    ]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def wait_healthy(server: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(
                f"the server exited ({server.returncode}): {log.read_text()[-2000:]}"
            )
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server did not become healthy in time: {log.read_text()[-2000:]}")


def stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def run_config(config: str, args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / f"agents-serve-{port}.log"
    with log_path.open("wb") as log:
        server = start_server(config, args, port, log)
    try:
        wait_healthy(server, url, args.start_timeout, log_path)
        start = time.perf_counter()
        result = run_bench(
            url,
            args.workload,
            request_rate=args.request_rate,
            num_requests=args.num_programs,
            seed=args.seed,
            max_duration=args.max_duration,
            workload_options=options,
        )
        wall = time.perf_counter() - start
        health = httpx.get(f"{url}/health", timeout=5).json()["engine"]
    finally:
        stop(server)
    programs = result.programs
    assert programs is not None
    return {
        "config": config,
        "programs": programs.to_dict(),
        "errors": len(result.errors),
        "error_samples": sorted(set(result.errors.values()))[:3],
        "wall_seconds": wall,
        "kv_blocks_used_at_end": health.get("kv_blocks_used"),
    }


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="agent-bfcl")
    parser.add_argument("--configs", default="fcfs:lru,plas:cost")
    parser.add_argument("--request-rate", type=float, default=0.5, help="programs/s")
    parser.add_argument("--num-programs", type=int, default=12)
    parser.add_argument("--num-blocks", type=int, default=96)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--offload-blocks", type=int, default=0)
    parser.add_argument("--max-duration", type=float, default=150.0, help="seconds per config")
    parser.add_argument("--start-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    options: dict[str, Any] = {}
    for item in args.workload_option:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    print(f"# {' '.join(sys.argv)}\n# machine: {machine()}", flush=True)
    rows = []
    out = Path(args.output_dir) if args.output_dir else None
    for config in args.configs.split(","):
        row = run_config(config, args, options)
        rows.append(row)
        if out is not None:  # after each configuration: a run cut short keeps what it has
            out.mkdir(parents=True, exist_ok=True)
            data = {"command": " ".join(sys.argv), "machine": machine(), "rows": rows}
            (out / f"agents-serve-{args.workload}.json").write_text(json.dumps(data, indent=1))
        p = row["programs"]
        c, t = p["completion_time"], p["turn_ttft"]
        print(f"{config}: programs {p['num_completed']}/{p['num_programs']} (failed "
              f"{p['num_failed']}, errors {row['errors']}); completion mean {_f(c['mean'])} s, "
              f"p50 {_f(c['p50'])}, p95 {_f(c['p95'])}; turn TTFT mean {_f(t['mean'], 3)} s, "
              f"p95 {_f(t['p95'], 3)}; {p['program_throughput']:.3f} programs/s; cached "
              f"{_f(p['cache_hit_rate'], 3)}; {row['wall_seconds']:.0f} s; KV blocks used "
              f"after: {row['kv_blocks_used_at_end']} (parked until their pin or TTL)",
              flush=True)
    base = rows[0]["programs"]["completion_time"]
    for row in rows[1:]:
        c = row["programs"]["completion_time"]
        if not (base["mean"] and c["mean"] and base["p95"] and c["p95"]):
            continue
        print(f"{rows[0]['config']} / {row['config']}: mean {base['mean'] / c['mean']:.2f}x, "
              f"p95 {base['p95'] / c['p95']:.2f}x")
    for row in rows:
        if row["errors"] or row["programs"]["num_failed"]:
            print(f"warning: {row['config']}: {row['errors']} errors, "
                  f"{row['programs']['num_failed']} failed programs")


if __name__ == "__main__":
    main()
