"""Where the serving path loses throughput: the same requests through every layer, one run.

Paths (each at every concurrency, closed loop, the paths interleaved per concurrency so that
drift of the machine hits them alike):

- `loop`: `Engine.step()` in a plain loop in this process (what `LLM.generate` does);
- `async`: the `AsyncEngine` (the engine loop in a thread of this process), consumed by one
  asyncio task per request, no HTTP;
- `serve-stream` / `serve`: `heddle serve` as a user runs it (a subprocess, its default
  process layout), streaming and non-streaming `/v1/completions`;
- `serve-thread-stream` / `serve-thread`: `heddle serve --engine-core thread`, the engine loop
  in a thread of the HTTP process (the layout before the engine core got its own process).

Every request has a distinct random-token prompt (no prefix-cache hits), greedy sampling and
`ignore_eos`, so every path computes exactly the same number of tokens. Reported per path and
concurrency: output tokens/s (all output tokens / wall time from the first submit to the last
finish), median TTFT and median TPOT as the consumer sees them (a token counts when the loop,
the stream or the HTTP chunk hands it over; a non-streaming response shows no token times), and
for the servers the CPU seconds per second of their HTTP process and of the engine core process.

    /work/tools/bench /work/tools/py benchmarks/serving_path.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from heddle.engine.async_engine import AsyncEngine
from heddle.engine.engine import Engine
from heddle.engine.llm import build_config
from heddle.request import SamplingParams

ALL_PATHS = ("loop", "async", "serve-stream", "serve", "serve-thread-stream", "serve-thread")


@dataclass(slots=True)
class Timing:
    """One request as its consumer saw it."""

    submitted: float
    token_times: list[float] = field(default_factory=list)
    finished: float = 0.0
    num_tokens: int = 0


@dataclass(slots=True)
class Result:
    path: str
    concurrency: int
    num_requests: int
    output_tokens: int
    wall: float
    ttft_p50: float | None
    tpot_p50: float | None
    e2e_p50: float
    # CPU seconds per wall second of the server's HTTP process and of its engine core process.
    frontend_cpu: float | None = None
    core_cpu: float | None = None

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall


def summarize(path: str, concurrency: int, timings: list[Timing]) -> Result:
    start = min(t.submitted for t in timings)
    end = max(t.finished for t in timings)
    ttfts = [t.token_times[0] - t.submitted for t in timings if t.token_times]
    tpots = [
        (t.token_times[-1] - t.token_times[0]) / (t.num_tokens - 1)
        for t in timings
        if len(t.token_times) > 1 and t.num_tokens > 1
    ]
    return Result(
        path,
        concurrency,
        len(timings),
        sum(t.num_tokens for t in timings),
        end - start,
        statistics.median(ttfts) if ttfts else None,
        statistics.median(tpots) if tpots else None,
        statistics.median(t.finished - t.submitted for t in timings),
    )


class Prompts:
    """Distinct random-token prompts: a new one for every request of the whole run."""

    def __init__(self, seed: int, input_len: int, vocab_size: int) -> None:
        self.rng = random.Random(seed)
        self.input_len = input_len
        self.vocab_size = vocab_size

    def next(self) -> list[int]:
        return [self.rng.randrange(100, self.vocab_size) for _ in range(self.input_len)]


# -- in-process paths ---------------------------------------------------------------------------
def run_loop(engine: Engine, prompts: list[list[int]], params: SamplingParams, c: int) -> list:
    """Closed loop: `c` requests in the engine at any moment, a new one when one finishes."""
    pending = list(enumerate(prompts))
    timings: dict[str, Timing] = {}

    def add() -> None:
        index, prompt = pending.pop(0)
        timings[str(index)] = Timing(time.perf_counter())
        engine.add_request(str(index), prompt, params)

    for _ in range(min(c, len(pending))):
        add()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            timing = timings[output.request_id]
            completion = output.outputs[0]
            timing.token_times.extend([now] * len(completion.delta_token_ids))
            if output.finished:
                timing.finished = now
                timing.num_tokens = len(completion.token_ids)
                if pending:
                    add()
    return list(timings.values())


def run_async(engine: Engine, prompts: list[list[int]], params: SamplingParams, c: int) -> list:
    async_engine = AsyncEngine(engine)

    async def one(index: int, prompt: list[int]) -> Timing:
        timing = Timing(time.perf_counter())
        async for output in async_engine.generate(str(index), prompt, params):
            now = time.perf_counter()
            completion = output.outputs[0]
            timing.token_times.extend([now] * len(completion.delta_token_ids))
            if output.finished:
                timing.finished = now
                timing.num_tokens = len(completion.token_ids)
        return timing

    async def main() -> list[Timing]:
        return await closed_loop(one, prompts, c)

    try:
        return asyncio.run(main())
    finally:
        async_engine.shutdown()


async def closed_loop(one: Any, prompts: list[list[int]], c: int) -> list[Timing]:
    queue = list(enumerate(prompts))
    timings: list[Timing] = []

    async def worker() -> None:
        while queue:
            index, prompt = queue.pop(0)
            timings.append(await one(index, prompt))

    await asyncio.gather(*(worker() for _ in range(c)))
    return timings


# -- HTTP paths ---------------------------------------------------------------------------------
class Server:
    """`heddle serve` in a subprocess, up once /health answers; SIGTERM when done."""

    def __init__(self, extra: list[str], args: argparse.Namespace, log: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "heddle", "serve", "--port", str(self.port),
            "--log-level", "warning", "--max-num-seqs", str(max(args.concurrency)),
            "--max-num-batched-tokens", str(args.max_num_batched_tokens), *extra,
        ]  # fmt: skip
        if args.num_threads:
            command += ["--num-threads", str(args.num_threads)]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log.open("wb")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited; see {log}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up; see {log}")
            time.sleep(0.5)

    def cpu_seconds(self) -> tuple[float, float]:
        """(this server's HTTP process, its children: the engine core) CPU seconds so far."""
        import psutil

        def total(process: psutil.Process) -> float:
            times = process.cpu_times()
            return float(times.user + times.system)

        front = psutil.Process(self.process.pid)
        return total(front), sum(total(child) for child in front.children(recursive=True))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_http(base_url: str, prompts: list[list[int]], max_tokens: int, c: int, stream: bool):
    async def main() -> list[Timing]:
        limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
        async with httpx.AsyncClient(
            base_url=base_url, timeout=600, limits=limits, trust_env=False
        ) as client:

            async def one(index: int, prompt: list[int]) -> Timing:
                body = {
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": stream,
                }
                timing = Timing(time.perf_counter())
                if not stream:
                    response = await client.post("/v1/completions", json=body)
                    response.raise_for_status()
                    timing.finished = time.perf_counter()
                    timing.num_tokens = response.json()["usage"]["completion_tokens"]
                    return timing
                body["stream_options"] = {"include_usage": True}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            timing.num_tokens = chunk["usage"]["completion_tokens"]
                        elif chunk["choices"] and chunk["choices"][0]["text"]:
                            timing.token_times.append(time.perf_counter())
                timing.finished = time.perf_counter()
                return timing

            return await closed_loop(one, prompts, c)

    return asyncio.run(main())


# -- the run ------------------------------------------------------------------------------------
def machine() -> str:
    model = platform.processor()
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8")
                flags = [f for f in line.split(":", 1)[1].split() if f in wanted]
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores; {' '.join(flags)})"


def markdown(results: list[Result], baseline: str = "loop") -> str:
    base = {r.concurrency: r for r in results if r.path == baseline}
    lines = [
        "| path | concurrency | requests | output tok/s | vs loop | TTFT p50 (ms) "
        "| TPOT p50 (ms) | E2E p50 (s) | CPU: HTTP / core |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(results, key=lambda r: (r.concurrency, ALL_PATHS.index(r.path))):
        ratio = f"{r.tok_s / base[r.concurrency].tok_s:.0%}" if r.concurrency in base else ""
        ttft = f"{r.ttft_p50 * 1000:.0f}" if r.ttft_p50 is not None else "–"
        tpot = f"{r.tpot_p50 * 1000:.1f}" if r.tpot_p50 is not None else "–"
        cpu = ""
        if r.frontend_cpu is not None and r.core_cpu is not None:
            cpu = f"{r.frontend_cpu:.2f} / {r.core_cpu:.2f}"
        lines.append(
            f"| {r.path} | {r.concurrency} | {r.num_requests} | {r.tok_s:.1f} | {ratio} "
            f"| {ttft} | {tpot} | {r.e2e_p50:.2f} | {cpu} |"
        )
    return "\n".join(lines) + "\n"


def codec_table(num_requests: int = 64, repeats: int = 2000) -> str:
    """Encode + decode of one step's output batch (one new token for each of `num_requests`):
    msgspec MessagePack with the wire schema against pickle of the same objects."""
    import pickle

    from heddle.engine.wire import Delta, Stats, StepBatch, decode_batch, encode_batch
    from heddle.metrics.steps import StepStat

    ids = [f"cmpl-{i:032x}" for i in range(num_requests)]
    batch = StepBatch(
        deltas=[Delta(rid, 0, [1234]) for rid in ids],
        stats=Stats(num_running=num_requests, kv_blocks_used=512, num_steps=100),
        steps=[StepStat(100, 1.0, 0.1, 0, num_requests, num_requests, 0, 512, 4096, ids, 512)],
    )
    rows = ["| codec | bytes | encode + decode (µs) |", "|---|---:|---:|"]
    for name, encode, decode in (
        ("msgspec msgpack", encode_batch, decode_batch),
        ("pickle", pickle.dumps, pickle.loads),
    ):
        data = encode(batch)
        start = time.perf_counter()
        for _ in range(repeats):
            decode(encode(batch))
        micros = (time.perf_counter() - start) / repeats * 1e6
        rows.append(f"| {name} | {len(data)} | {micros:.0f} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", action="store_true", help="only time the output batch codec")
    parser.add_argument("--paths", default=",".join(ALL_PATHS), help="comma-separated")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--requests-per-slot", type=int, default=1)
    parser.add_argument("--min-requests", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads (all paths)")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="results/serving_path")
    args = parser.parse_args()
    if args.codec:
        print(codec_table())
        return
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(ALL_PATHS))
    if unknown:
        parser.error(f"unknown paths: {', '.join(unknown)}; choose from {', '.join(ALL_PATHS)}")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}", flush=True)

    config = build_config(
        max_num_seqs=max(args.concurrency),
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_threads=args.num_threads,
    )
    engine = Engine.from_config(config) if {"loop", "async"} & set(paths) else None
    servers: dict[str, Server] = {}
    if {"serve", "serve-stream"} & set(paths):
        servers["serve"] = Server([], args, out / "serve.log")
    if {"serve-thread", "serve-thread-stream"} & set(paths):
        servers["serve-thread"] = Server(["--engine-core", "thread"], args, out / "thread.log")
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    prompts = Prompts(args.seed, args.input_len, args.vocab_size)
    results: list[Result] = []
    try:
        # Warm up every process at every concurrency outside the measurement: the first use
        # of a matmul shape is slow (oneDNN builds a kernel for it), whoever meets it first.
        warm_tokens = min(16, args.output_len)
        warm_params = SamplingParams(temperature=0.0, max_tokens=warm_tokens, ignore_eos=True)
        for c in args.concurrency:
            if engine is not None:
                run_loop(engine, [prompts.next() for _ in range(c)], warm_params, c)
            for server in servers.values():
                batch = [prompts.next() for _ in range(c)]
                run_http(server.base_url, batch, warm_tokens, c, stream=True)
        for c in args.concurrency:
            n = max(args.min_requests, args.requests_per_slot * c)
            for path in paths:
                batch = [prompts.next() for _ in range(n)]
                time.sleep(1.0)  # let the last path's threads go idle
                if path == "loop":
                    assert engine is not None
                    timings = run_loop(engine, batch, params, c)
                elif path == "async":
                    assert engine is not None
                    timings = run_async(engine, batch, params, c)
                else:
                    server = servers[path.removesuffix("-stream")]
                    stream = path.endswith("-stream")
                    cpu_before = server.cpu_seconds()
                    timings = run_http(server.base_url, batch, args.output_len, c, stream)
                    cpu_after = server.cpu_seconds()
                result = summarize(path, c, timings)
                if path not in ("loop", "async"):
                    result.frontend_cpu = (cpu_after[0] - cpu_before[0]) / result.wall
                    result.core_cpu = (cpu_after[1] - cpu_before[1]) / result.wall
                expected = n * args.output_len
                if result.output_tokens != expected:
                    raise RuntimeError(f"{path} c={c}: {result.output_tokens} of {expected} tokens")
                results.append(result)
                print(
                    f"{path:>20} c={c:<3} {result.tok_s:7.1f} tok/s  ttft "
                    f"{result.ttft_p50 or 0:.3f}s  tpot {result.tpot_p50 or 0:.4f}s",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.close()
    text = f"machine: {machine()}\n\ncommand: `{' '.join(sys.argv)}`\n\n" + markdown(results)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps([_row(r) for r in results], indent=1) + "\n")
    print(text)


def _row(result: Result) -> dict[str, Any]:
    return {name: getattr(result, name) for name in Result.__slots__} | {"tok_s": result.tok_s}


if __name__ == "__main__":
    main()
