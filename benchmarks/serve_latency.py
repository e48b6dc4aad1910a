"""`heddle serve` at concurrency 1 against the offline engine: end-to-end latency side by side.

One request at a time, the same request (seeded token-id prompt of --prompt-len tokens,
max_tokens=--output-len, ignore_eos, greedy) through
- the offline engine in this process (`Engine.add_request` + `step()` until it finishes), and
- `heddle serve` in a subprocess on 127.0.0.1 (streaming /v1/completions; from sending the
  request to the last byte of the stream),
alternating the two so that drift on the machine hits both alike. Reported: the median
latency of each and the server's added share. The server is idle while the offline engine
runs and the other way round, so both have the machine's cores.

    /work/tools/bench /work/tools/py benchmarks/serve_latency.py
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from heddle.engine.llm import LLM
from heddle.request import SamplingParams

SERVE = (
    "import sys\n"
    "from heddle.cli import main\n"
    "sys.argv = ['heddle', 'serve', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def offline_latency(llm: LLM, request_id: str, prompt: list[int], output_len: int) -> float:
    engine = llm.engine
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    start = time.perf_counter()
    engine.add_request(request_id, prompt, params)
    done = False
    while not done:
        for output in engine.step():
            if output.finished:
                if len(output.outputs[0].token_ids) != output_len:
                    raise RuntimeError("the offline engine generated the wrong number of tokens")
                done = True
    return time.perf_counter() - start


def served_latency(
    client: httpx.Client, url: str, model: str, prompt: list[int], output_len: int
) -> float:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    chunks = 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += 1
    elapsed = time.perf_counter() - start
    if chunks == 0:
        raise RuntimeError("the server streamed nothing")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=12)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="auto | bfloat16 | float32")
    parser.add_argument("--engine-core", default="process", choices=("process", "thread"))
    parser.add_argument("--output", default="results/serve_latency.json")
    args = parser.parse_args()

    engine_flags = ["--num-threads", str(args.num_threads), "--dtype", args.dtype]
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
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited; see {log}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not come up")
            time.sleep(0.5)
        llm = LLM(dtype=args.dtype, num_threads=args.num_threads)
        vocab = llm.engine.vocab_size or 32000
        rng = random.Random(0)
        prompts = [
            [rng.randrange(100, vocab) for _ in range(args.prompt_len)]
            for _ in range(args.num_requests + 1)
        ]
        offline, served = [], []
        with httpx.Client(timeout=600) as client:
            model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
            # Warm-up of both paths (first-use kernel builds, allocator, HTTP connection).
            offline_latency(llm, "warm", prompts[-1], 4)
            served_latency(client, url, model, prompts[-1], 4)
            for i in range(args.num_requests):
                prompt = prompts[i]
                if i % 2 == 0:
                    offline.append(offline_latency(llm, f"o{i}", prompt, args.output_len))
                    served.append(served_latency(client, url, model, prompt, args.output_len))
                else:
                    served.append(served_latency(client, url, model, prompt, args.output_len))
                    offline.append(offline_latency(llm, f"o{i}", prompt, args.output_len))
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    off, srv = statistics.median(offline), statistics.median(served)
    print(
        f"machine: {cpu_model()}, torch threads {args.num_threads}, dtype {args.dtype}, "
        f"engine core: {args.engine_core}"
    )
    print(
        f"{args.num_requests} requests of {args.prompt_len} prompt + {args.output_len} output "
        f"tokens, one at a time: offline median {1000 * off:.0f} ms, served median "
        f"{1000 * srv:.0f} ms, added {100 * (srv / off - 1):.1f}%"
    )
    Path(args.output).write_text(
        json.dumps(
            {
                "machine": cpu_model(),
                "dtype": args.dtype,
                "engine_core": args.engine_core,
                "prompt_len": args.prompt_len,
                "output_len": args.output_len,
                "offline_s": offline,
                "served_s": served,
                "offline_median_s": off,
                "served_median_s": srv,
                "added_share": srv / off - 1,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
