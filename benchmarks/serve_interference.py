"""Why `heddle serve` at concurrency 1 is slower than the offline engine: conditions side by side.

Every condition runs the same requests (seeded token-id prompts of --prompt-len tokens,
--output-len greedy tokens, ignore_eos), one at a time, the conditions interleaved round by
round so that drift on the machine hits all alike. Each offline condition is an engine in a
worker process of its own (started with the condition's environment, e.g. OMP_WAIT_POLICY, which
the OpenMP runtime reads once at start); each served condition a `heddle serve` process (its
engine core a child of it, same environment). Conditions (--conditions, comma-separated):

  off            the offline engine alone (Engine.add_request + step() until done)
  off+nbX        the same engine, and after every step that produced a token a neighbour
                 process is woken to burn X ms of CPU (what the served path's HTTP process and
                 client do per token: ~1.2 + 0.3 ms measured), while the next step runs
  serve          `heddle serve`, streaming /v1/completions (what benchmarks/serve_latency.py times)
  serve-nostream the same server, stream=false (the front end still gets a batch per step)
  X-passive      X with OMP_WAIT_POLICY=PASSIVE (waiting OpenMP threads sleep, not spin)
  X-spinN        X with GOMP_SPINCOUNT=N
  X-thp          X with THP_MEM_ALLOC_ENABLE=1 (torch's CPU allocator puts tensors of 2 MB and
                 more on transparent huge pages: madvise, which this box's THP setting needs)
  X#k            another process of condition X (the same settings): the spread between
                 processes that differ in nothing

--replicas K runs every listed condition in K processes (X, X#2 .. X#K), and the summary then
gives, per condition, the median over its processes of each process's median latency, the
spread over processes (min-max), and the ratio of each condition's median to the first's: the
serving verdict at concurrency 1 is `--replicas 3 --conditions off,serve` (two processes of one
condition differ by up to ~18% per step on this VM, a per-process property, so one process per
side measures that draw, not the serving path).

Per condition: median end-to-end latency, median gap between tokens, mean `Executor.execute`
per step (the worker's engine counter; the core's /metrics heddle_step_duration_seconds), and
involuntary context switches of the engine's process per output token.

    /work/tools/bench /work/tools/py benchmarks/serve_interference.py
    /work/tools/bench /work/tools/py benchmarks/serve_interference.py --replicas 3 \
        --conditions off,serve --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

from heddle.bench.server import wait_healthy
from heddle.hostinfo import free_port, machine_line

SERVE = (
    "import sys\n"
    "from heddle.cli import main\n"
    "sys.argv = ['heddle', 'serve', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)

# The neighbour: reads a line per wake-up (milliseconds to burn), burns that much CPU time.
NEIGHBOUR = (
    "import sys, time\n"
    "for line in sys.stdin:\n"
    "    end = time.thread_time() + float(line) / 1000\n"
    "    while time.thread_time() < end:\n"
    "        pass\n"
)

# The offline worker: one engine; one JSON command per line on stdin, one JSON answer per line.
WORKER = r"""
import json, os, subprocess, sys, time
from heddle.engine.llm import LLM
from heddle.request import SamplingParams
args = json.loads(sys.argv[1])
llm = LLM(dtype=args["dtype"], num_threads=args["num_threads"])
engine = llm.engine
neighbour = subprocess.Popen([sys.executable, "-c", args["neighbour"]], stdin=subprocess.PIPE,
                             text=True, bufsize=1)

def nonvoluntary():
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total

import torch
print(json.dumps({"ready": True, "threads": torch.get_num_threads(),
                  "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd.get("quit"):
        break
    burn = cmd["neighbour_ms"]
    params = SamplingParams(max_tokens=cmd["output_len"], ignore_eos=True, temperature=0.0)
    steps, seconds, switches = engine.num_steps, engine.execute_seconds, nonvoluntary()
    start = time.perf_counter()
    times = []
    copies = cmd["concurrency"]
    for c in range(copies):
        prompt = cmd["prompt"] if c == 0 else [(t + 7 * c) % 40000 + 100 for t in cmd["prompt"]]
        engine.add_request(f'{cmd["id"]}-{c}', prompt, params)
    done = 0
    while done < copies:
        stepped = False
        for output in engine.step():
            if output.outputs[0].delta_token_ids:
                stepped = True
                if output.request_id.endswith("-0"):
                    times.append(time.perf_counter())
            if output.finished:
                done += 1
        if stepped and burn > 0:
            neighbour.stdin.write(f"{burn}\n")
    end = time.perf_counter()
    print(json.dumps({"latency": end - start, "ttft": times[0] - start,
                      "gap": (times[-1] - times[0]) / max(1, len(times) - 1),
                      "steps": engine.num_steps - steps,
                      "execute_s": engine.execute_seconds - seconds,
                      "switches": nonvoluntary() - switches, "tokens": len(times)}), flush=True)
neighbour.stdin.close()
neighbour.wait()
"""


def env_for(condition: str) -> dict[str, str]:
    env = dict(os.environ)
    for part in condition.split("#")[0].split("-")[1:]:
        if part == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        elif part.startswith("spin"):
            env["GOMP_SPINCOUNT"] = part.removeprefix("spin")
        elif part == "thp":
            env["THP_MEM_ALLOC_ENABLE"] = "1"  # torch's CPU allocator: 2 MB pages, madvise
        elif part == "nothp":
            env["THP_MEM_ALLOC_ENABLE"] = "0"
    return env


def huge_pages_kib(pid: int) -> int:
    """AnonHugePages of a process (kB), from /proc/PID/smaps_rollup."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def neighbour_ms(condition: str) -> float:
    match = re.search(r"\+nb([0-9.]+)", condition)
    return float(match.group(1)) if match else 0.0


class Worker:
    def __init__(self, env: dict[str, str], dtype: str, num_threads: int) -> None:
        spec = json.dumps({"dtype": dtype, "num_threads": num_threads, "neighbour": NEIGHBOUR})
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, text=True, bufsize=1,
        )  # fmt: skip
        self.info = self._read()

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("an offline worker exited")
        return json.loads(line)

    @property
    def pid(self) -> int:
        return self.process.pid

    def run(
        self, request_id: str, prompt: list[int], output_len: int, burn: float, concurrency: int
    ) -> dict:
        assert self.process.stdin is not None
        command = {"id": request_id, "prompt": prompt, "output_len": output_len,
                   "neighbour_ms": burn, "concurrency": concurrency}  # fmt: skip
        self.process.stdin.write(json.dumps(command) + "\n")
        return self._read()

    def close(self) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps({"quit": True}) + "\n")
            self.process.stdin.close()
            self.process.wait(30)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.process.kill()  # it died already (e.g. a `timeout` signalled the group) or hangs
            self.process.wait(30)


def _nonvoluntary(process: psutil.Process) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{process.pid}/task"):
        with open(f"/proc/{process.pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total


class Server:
    def __init__(self, env: dict[str, str], dtype: str, num_threads: int, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with log.open("wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-c", SERVE, "--port", str(self.port), "--log-level", "warning",
                 "--num-threads", str(num_threads), "--dtype", dtype],
                stdout=log_file, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        self.client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=256))
        wait_healthy(self.process, self.url, 300, log, self.client)
        self.model = self.client.get(f"{self.url}/v1/models").json()["data"][0]["id"]
        self.core = psutil.Process(self.process.pid).children(recursive=True)[0]

    @property
    def pid(self) -> int:
        return self.core.pid

    def _steps(self) -> tuple[float, float]:
        text = self.client.get(f"{self.url}/metrics").text
        total = re.search(r"^heddle_step_duration_seconds_sum (\S+)", text, re.M)
        count = re.search(r"^heddle_step_duration_seconds_count (\S+)", text, re.M)
        assert total is not None and count is not None
        return float(total.group(1)), float(count.group(1))

    def _one(self, prompt: list[int], output_len: int, stream: bool) -> list[float]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": output_len,
                "temperature": 0.0, "ignore_eos": True, "stream": stream}  # fmt: skip
        times: list[float] = []
        if stream:
            with self.client.stream("POST", f"{self.url}/v1/completions", json=body) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        times.append(time.perf_counter())
        else:
            response = self.client.post(f"{self.url}/v1/completions", json=body)
            response.raise_for_status()
        return times

    def run(self, prompt: list[int], output_len: int, stream: bool, concurrency: int) -> dict:
        total, count = self._steps()
        switches = _nonvoluntary(self.core)
        start = time.perf_counter()
        if concurrency == 1:
            times = self._one(prompt, output_len, stream)
        else:
            prompts = [prompt] + [[(t + 7 * c) % 40000 + 100 for t in prompt]
                                  for c in range(1, concurrency)]  # fmt: skip
            with ThreadPoolExecutor(concurrency) as pool:
                futures = [pool.submit(self._one, p, output_len, stream) for p in prompts]
                times = futures[0].result()
                for future in futures[1:]:
                    future.result()
        end = time.perf_counter()
        switches = _nonvoluntary(self.core) - switches
        total2, count2 = self._steps()
        first = times[0] if times else end
        return {"latency": end - start, "ttft": first - start,
                "gap": (times[-1] - first) / max(1, len(times) - 1) if times else 0.0,
                "steps": count2 - count, "execute_s": total2 - total, "switches": switches,
                "tokens": output_len * concurrency}  # fmt: skip

    def close(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--conditions",
        default="off,off+nb1.5,off+nb3,serve,serve-nostream,serve-passive,off-passive,"
        "off-passive+nb1.5",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--replicas", type=int, default=1, help="processes per listed condition (X, X#2, ...)"
    )
    parser.add_argument("--concurrency", type=int, default=1, help="streams per request slot")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--output", default="results/serve_interference.json")
    args = parser.parse_args()
    # A `timeout` around this script sends SIGTERM: end through `finally`, stopping the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    conditions = expand_replicas(args.conditions.split(","), args.replicas)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)

    # One engine per distinct (kind, environment): conditions that differ only in the neighbour
    # share a worker.
    engines: dict[str, Worker | Server] = {}

    def engine_key(condition: str) -> str:
        base = re.sub(r"\+nb[0-9.]+", "", condition)
        return base.replace("serve-nostream", "serve")

    results: dict[str, list[dict]] = {c: [] for c in conditions}
    rng = random.Random(0)
    vocab = 49152
    prompts = [[rng.randrange(100, vocab) for _ in range(args.prompt_len)]
               for _ in range(args.rounds + 1)]  # fmt: skip
    try:
        for condition in conditions:
            key = engine_key(condition)
            if key in engines:
                continue
            env = env_for(key)
            if key.startswith("serve"):
                log = Path(args.output).with_suffix(f".{key}.log")
                engines[key] = Server(env, args.dtype, args.num_threads, log)
            else:
                engines[key] = Worker(env, args.dtype, args.num_threads)
        huge = {key: huge_pages_kib(engine.pid) for key, engine in engines.items()}
        # Warm-up: every condition once, short.
        for condition in conditions:
            run_one(
                engines[engine_key(condition)], condition, "warm", prompts[-1], 4, args.concurrency
            )
        for i in range(args.rounds):
            order = conditions[i % len(conditions) :] + conditions[: i % len(conditions)]
            for condition in order:
                outcome = run_one(engines[engine_key(condition)], condition, f"r{i}", prompts[i],
                                  args.output_len, args.concurrency)  # fmt: skip
                results[condition].append(outcome)
    finally:
        for engine in engines.values():
            engine.close()

    print(f"machine: {machine_line()}; torch threads {args.num_threads}, dtype {args.dtype}")
    print(f"{args.rounds} rounds of {args.concurrency} x ({args.prompt_len} prompt + "
          f"{args.output_len} output tokens)")  # fmt: skip
    base = statistics.median(r["latency"] for r in results[conditions[0]])
    print(
        "condition           latency ms  vs first  gap ms  execute/step ms  invol.sw/token"
        "  output tok/s"
    )
    summary = {}
    for condition in conditions:
        runs = results[condition]
        latency = statistics.median(r["latency"] for r in runs)
        gap = statistics.median(r["gap"] for r in runs)
        step = sum(r["execute_s"] for r in runs) / max(1, sum(r["steps"] for r in runs))
        switches = sum(r["switches"] for r in runs) / sum(r["tokens"] for r in runs)
        summary[condition] = {"latency_s": latency, "gap_s": gap, "execute_per_step_s": step,
                              "nonvoluntary_per_token": switches,
                              "anon_huge_pages_kib": huge[engine_key(condition)]}  # fmt: skip
        print(f"{condition:<20}{1000 * latency:>10.0f}{latency / base:>10.3f}{1000 * gap:>8.2f}"
              f"{1000 * step:>17.2f}{switches:>16.2f}"
              f"{args.concurrency * args.output_len / latency:>14.1f}"
              f"{huge[engine_key(condition)] / 1024:>10.0f}")  # fmt: skip
    sides = side_summary(summary)
    if any(len(side["processes"]) > 1 for side in sides.values()):
        first = next(iter(sides.values()))["latency_median_s"]
        print("\nper condition over its processes (each process: its median latency)")
        print("condition      processes  median ms  min ms  max ms  spread  vs first")
        for name, side in sides.items():
            low, high = side["latency_min_s"], side["latency_max_s"]
            print(f"{name:<15}{len(side['processes']):>9}{1000 * side['latency_median_s']:>11.0f}"
                  f"{1000 * low:>8.0f}{1000 * high:>8.0f}{high / low - 1:>8.1%}"
                  f"{side['latency_median_s'] / first:>10.3f}")  # fmt: skip
    record = {"machine": machine_line(), "args": vars(args), "summary": summary, "sides": sides,
              "runs": results}  # fmt: skip
    Path(args.output).write_text(json.dumps(record, indent=1))


def expand_replicas(conditions: list[str], replicas: int) -> list[str]:
    """Every condition in `replicas` processes: X, X#2, ..., X#K (an explicit X#k is kept)."""
    expanded: list[str] = []
    for condition in conditions:
        expanded.append(condition)
        if "#" not in condition:
            expanded.extend(f"{condition}#{k}" for k in range(2, replicas + 1))
    if len(set(expanded)) != len(expanded):
        raise SystemExit(f"serve_interference.py: a condition is listed twice: {expanded}")
    return expanded


def side_summary(summary: dict[str, dict]) -> dict[str, dict]:
    """Group the processes of each condition (X, X#2, ...): median of their medians, spread."""
    groups: dict[str, list[str]] = {}
    for condition in summary:
        groups.setdefault(condition.split("#")[0], []).append(condition)
    sides = {}
    for name, members in groups.items():
        latencies = [summary[m]["latency_s"] for m in members]
        sides[name] = {"processes": members, "latency_median_s": statistics.median(latencies),
                       "latency_min_s": min(latencies), "latency_max_s": max(latencies),
                       "execute_per_step_median_s": statistics.median(
                           summary[m]["execute_per_step_s"] for m in members)}  # fmt: skip
    return sides


def run_one(engine: Worker | Server, condition: str, request_id: str, prompt: list[int],
            output_len: int, concurrency: int) -> dict:  # fmt: skip
    if isinstance(engine, Server):
        return engine.run(prompt, output_len, "nostream" not in condition, concurrency)
    return engine.run(request_id, prompt, output_len, neighbour_ms(condition), concurrency)


if __name__ == "__main__":
    main()
