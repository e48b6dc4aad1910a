"""`heddle serve` at concurrency 1 against the offline engine: end-to-end latency side by side.

One request at a time, the same request (seeded token-id prompt of --prompt-len tokens,
max_tokens=--output-len, ignore_eos, greedy) through
- the offline engine in this process (`Engine.add_request` + `step()` until it finishes), and
- `heddle serve` in a subprocess on 127.0.0.1 (streaming /v1/completions; from sending the
  request to the last byte of the stream),
alternating the two so that drift on the machine hits both alike. Reported: the median
latency of each and the server's added share, and where the difference goes: time to the first
token and the mean gap between tokens (both medians over requests), the mean time of
`Executor.execute` per step (the offline engine's own counter; the core's from /metrics'
heddle_step_duration_seconds, which times the same call), and the CPU seconds per
output token of the HTTP process, the engine core process and this (client) process. The
server is idle while the offline engine runs and the other way round, so both have the
machine's cores.

    /work/tools/bench /work/tools/py benchmarks/serve_latency.py

What one run of it can and cannot say: see benchmarks/serve_interference.py (two processes
started alike differ by up to ~18% per step on the 2-core box; compare several per side).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from heddle.bench.server import wait_healthy
from heddle.engine.llm import LLM
from heddle.hostinfo import free_port, machine_line
from heddle.request import SamplingParams

SERVE = (
    "import sys\n"
    "from heddle.cli import main\n"
    "sys.argv = ['heddle', 'serve', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)


@dataclass(slots=True)
class Timing:
    """One request: end to end, first token, mean gap between later tokens (seconds)."""

    latency: float
    ttft: float
    gap: float


def _timing(start: float, token_times: list[float], end: float) -> Timing:
    first = token_times[0] if token_times else end
    gaps = (token_times[-1] - first) / (len(token_times) - 1) if len(token_times) > 1 else 0.0
    return Timing(end - start, first - start, gaps)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _step_metric(client: httpx.Client, url: str) -> tuple[float, float]:
    """(sum, count) of the server's heddle_step_duration_seconds histogram."""
    text = client.get(f"{url}/metrics").text
    total = re.search(r"^heddle_step_duration_seconds_sum (\S+)", text, re.M)
    count = re.search(r"^heddle_step_duration_seconds_count (\S+)", text, re.M)
    if total is None or count is None:
        raise RuntimeError("the server's /metrics has no heddle_step_duration_seconds")
    return float(total.group(1)), float(count.group(1))


def offline_latency(llm: LLM, request_id: str, prompt: list[int], output_len: int) -> Timing:
    engine = llm.engine
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    start = time.perf_counter()
    token_times: list[float] = []
    engine.add_request(request_id, prompt, params)
    done = False
    while not done:
        for output in engine.step():
            if output.outputs[0].delta_token_ids:
                token_times.append(time.perf_counter())
            if output.finished:
                if len(output.outputs[0].token_ids) != output_len:
                    raise RuntimeError("the offline engine generated the wrong number of tokens")
                done = True
    return _timing(start, token_times, time.perf_counter())


def served_latency(
    client: httpx.Client, url: str, model: str, prompt: list[int], output_len: int
) -> Timing:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    token_times: list[float] = []
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                token_times.append(time.perf_counter())
    end = time.perf_counter()
    if not token_times:
        raise RuntimeError("the server streamed nothing")
    return _timing(start, token_times, end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=12)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="auto | bfloat16 | float32")
    parser.add_argument("--quantization", default=None, help="passed to both engines")
    parser.add_argument("--engine-core", default="process", choices=("process", "thread"))
    parser.add_argument(
        "--huge-pages",
        default="on",
        choices=("on", "off"),
        help="THP_MEM_ALLOC_ENABLE=1 / 0 for both sides (this process and the server's core, "
        "which inherits it): torch's CPU allocator puts tensors of 2 MB and more on transparent "
        "huge pages. Either way both sides run with the same memory setting.",
    )
    parser.add_argument("--output", default="results/serve_latency.json")
    args = parser.parse_args()
    wanted = "1" if args.huge_pages == "on" else "0"
    if os.environ.get("THP_MEM_ALLOC_ENABLE") != wanted:
        # torch reads it once, at its first allocation: start again with it set.
        env = {**os.environ, "THP_MEM_ALLOC_ENABLE": wanted}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    engine_flags = ["--num-threads", str(args.num_threads), "--dtype", args.dtype]
    quantization = {} if args.quantization is None else {"quantization": args.quantization}
    if args.quantization is not None:
        engine_flags += ["--quantization", args.quantization]
    port = free_port()
    log = Path(args.output).with_suffix(".server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE, "--port", str(port), "--log-level", "warning",
             "--engine-core", args.engine_core, *engine_flags],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url, 300, log)
        llm = LLM(dtype=args.dtype, num_threads=args.num_threads, **quantization)
        vocab = llm.engine.vocab_size or 32000
        rng = random.Random(0)
        prompts = [
            [rng.randrange(100, vocab) for _ in range(args.prompt_len)]
            for _ in range(args.num_requests + 1)
        ]
        huge = {"offline": huge_pages_mib(os.getpid()), "core": 0.0}
        offline: list[Timing] = []
        served: list[Timing] = []
        engine = llm.engine
        front = psutil.Process(server.pid)
        cores = front.children(recursive=True)
        huge["core"] = sum(huge_pages_mib(c.pid) for c in cores)
        me = psutil.Process()
        offline_steps = offline_step_seconds = 0.0
        served_steps = served_step_seconds = 0.0
        cpu = {"front": 0.0, "core": 0.0, "client_served": 0.0, "client_offline": 0.0}
        with httpx.Client(timeout=600) as client:
            model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
            # Warm-up of both paths (first-use kernel builds, allocator, HTTP connection).
            offline_latency(llm, "warm", prompts[-1], 4)
            served_latency(client, url, model, prompts[-1], 4)

            def run_offline(i: int) -> None:
                nonlocal offline_steps, offline_step_seconds
                steps, seconds = engine.num_steps, engine.execute_seconds
                before = _cpu_seconds(me)
                offline.append(offline_latency(llm, f"o{i}", prompts[i], args.output_len))
                cpu["client_offline"] += _cpu_seconds(me) - before
                offline_steps += engine.num_steps - steps
                offline_step_seconds += engine.execute_seconds - seconds

            def run_served(i: int) -> None:
                nonlocal served_steps, served_step_seconds
                total, count = _step_metric(client, url)
                before = (
                    _cpu_seconds(front),
                    sum(_cpu_seconds(c) for c in cores),
                    _cpu_seconds(me),
                )
                served.append(served_latency(client, url, model, prompts[i], args.output_len))
                after = (_cpu_seconds(front), sum(_cpu_seconds(c) for c in cores), _cpu_seconds(me))
                cpu["front"] += after[0] - before[0]
                cpu["core"] += after[1] - before[1]
                cpu["client_served"] += after[2] - before[2]
                total2, count2 = _step_metric(client, url)
                served_steps += count2 - count
                served_step_seconds += total2 - total

            for i in range(args.num_requests):
                if i % 2 == 0:
                    run_offline(i)
                    run_served(i)
                else:
                    run_served(i)
                    run_offline(i)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()

    def median(timings: list[Timing], field: str) -> float:
        return statistics.median(getattr(t, field) for t in timings)

    off, srv = median(offline, "latency"), median(served, "latency")
    tokens = args.num_requests * args.output_len
    cpu_per_token = {k: v / tokens for k, v in cpu.items()}
    breakdown: dict[str, float] = {
        "offline_ttft_s": median(offline, "ttft"),
        "served_ttft_s": median(served, "ttft"),
        "offline_gap_s": median(offline, "gap"),
        "served_gap_s": median(served, "gap"),
        "offline_step_s": offline_step_seconds / max(1.0, offline_steps),
        "served_step_s": served_step_seconds / max(1.0, served_steps),
    }
    print(
        f"machine: {machine_line()}; torch threads {args.num_threads}, dtype {args.dtype}, "
        f"engine core: {args.engine_core}; THP_MEM_ALLOC_ENABLE={wanted} (huge pages: offline "
        f"{huge['offline']:.0f} MiB, core {huge['core']:.0f} MiB)"
    )
    print(
        f"{args.num_requests} requests of {args.prompt_len} prompt + {args.output_len} output "
        f"tokens, one at a time: offline median {1000 * off:.0f} ms, served median "
        f"{1000 * srv:.0f} ms, ratio {srv / off:.3f} (added {100 * (srv / off - 1):.1f}%)"
    )
    b = breakdown
    print(
        f"  first token (median): offline {1000 * b['offline_ttft_s']:.1f} ms, served "
        f"{1000 * b['served_ttft_s']:.1f} ms; gap between tokens (median of means): offline "
        f"{1000 * b['offline_gap_s']:.2f} ms, served {1000 * b['served_gap_s']:.2f} ms"
    )
    print(
        f"  Executor.execute per step (mean): offline {1000 * b['offline_step_s']:.2f} ms, "
        f"served core {1000 * b['served_step_s']:.2f} ms"
    )
    c = cpu_per_token
    print(
        f"  CPU ms per output token: served: HTTP process {1000 * c['front']:.2f}, engine core "
        f"{1000 * c['core']:.2f}, client {1000 * c['client_served']:.2f}; offline: "
        f"{1000 * c['client_offline']:.2f}"
    )
    Path(args.output).write_text(
        json.dumps(
            {
                "machine": machine_line(),
                "dtype": args.dtype,
                "engine_core": args.engine_core,
                "num_threads": args.num_threads,
                "prompt_len": args.prompt_len,
                "output_len": args.output_len,
                "offline": [as_dict(t) for t in offline],
                "served": [as_dict(t) for t in served],
                "offline_median_s": off,
                "served_median_s": srv,
                "ratio": srv / off,
                "added_share": srv / off - 1,
                **breakdown,
                "cpu_per_token_s": cpu_per_token,
                "thp_mem_alloc_enable": wanted,
                "anon_huge_pages_mib": huge,
            },
            indent=1,
        )
    )


def huge_pages_mib(pid: int) -> float:
    """A process's memory on transparent huge pages (AnonHugePages, /proc/PID/smaps_rollup)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def as_dict(timing: Timing) -> dict[str, float]:
    return {"latency": timing.latency, "ttft": timing.ttft, "gap": timing.gap}


if __name__ == "__main__":
    main()
