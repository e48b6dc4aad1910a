"""Scale-out: router policies over replicas in the simulator, and real replicas on Ray.

`sim`: N replicas of Llama-3.1-8B on one H100 each (roofline cost model) behind every router
policy, on chat, a long-prompt mix and a multi-turn agent workload, at 8 and 32 replicas;
each workload's load is a fraction of one replica's measured capacity times N. Also the
throughput scaling from 1 to 32 replicas on chat, and a failure run (a replica killed and
restarted under load). Results: results/scaling/sim.json; tables on stdout (docs/SCALING.md).

    python benchmarks/scaling.py sim --jobs 2            # the whole study
    python benchmarks/scaling.py sim --replicas 8 --workloads multi-turn --routers affinity

`real`: the real engine (embedded SmolLM2-135M), one replica with one thread vs two replicas
with one thread each (`heddle serve --replicas 2`, local Ray), at the same load per core, with
the bench client; then the two-replica run again with one replica killed under load. Run it
under /work/tools/bench (it holds the machine):

    python benchmarks/scaling.py real
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from heddle.cli.flags import parse_key_values

RESULTS = Path("results/scaling")
MODEL, HARDWARE = "llama-3.1-8b", "h100"
ROUTERS = ("round-robin", "least-tokens", "pow2", "ray-prefix", "affinity", "class-aware")
# name -> (heddle workload, options). The multi-turn workload is agent programs with long
# contexts (a SWE-like agent: 2k-token first prompt, tool results of ~400 tokens, 4-10 calls).
WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("chat", {}),
    "long-prompt-mix": ("long-prompt-mix", {"long_share": 0.2}),
    "multi-turn": (
        "agent",
        {
            "prompt_mean": 2000.0,
            "tool_result_mean": 400.0,
            "output_mean": 150.0,
            "min_calls": 4,
            "max_calls": 10,
            "tool_latency_mean": 1.0,
            "max_context_len": 12000,
        },
    ),
}
LOAD = 0.8  # offered load as a fraction of N x one replica's capacity
REQUESTS_PER_REPLICA = {"chat": 250, "long-prompt-mix": 250, "multi-turn": 40}  # programs
SCALE_REPLICAS = (1, 2, 4, 8, 16, 32)
SCALE_LOAD = 1.1  # keeps every replica busy
SCALE_REQUESTS_PER_REPLICA = 500


# -- simulator -----------------------------------------------------------------------------
def _setup() -> tuple[Any, Any, int, int]:
    from heddle.config import EngineConfig, SchedulerConfig
    from heddle.sim import sim_machine

    config = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256))
    machine = sim_machine(config, model=MODEL, hardware=HARDWARE, tp=1)
    return config, machine.cost_model, machine.num_blocks, machine.shape.vocab_size


def run_cluster(
    workload_name: str,
    num_replicas: int,
    router: str,
    rate: float,
    num_requests: int,
    seed: int = 0,
    failures: tuple[tuple[int, float, float | None], ...] = (),
) -> dict[str, Any]:
    from heddle.metrics import summarize
    from heddle.router.replay import ReplicaFailure
    from heddle.router.simulate import simulate_cluster
    from heddle.workloads import get_workload

    config, cost, blocks, vocab = _setup()
    name, options = WORKLOADS[workload_name]
    # A router spec is NAME or NAME:KEY=VALUE,KEY=VALUE (e.g. class-aware:bulk_share=0.5).
    router_name, _, spec = router.partition(":")
    router_options = parse_key_values([kv for kv in spec.split(",") if kv], "a router spec")
    workload = get_workload(name, num_requests=num_requests, rate=rate, seed=seed, **options)
    result = simulate_cluster(
        workload,
        config,
        cost,
        num_replicas=num_replicas,
        router=router_name,
        router_options=router_options,
        num_blocks=blocks,
        vocab_size=vocab,
        failures=[ReplicaFailure(*f) for f in failures],
        seed=seed,
    )
    summary = summarize(result.records)
    o = summary.overall
    return {
        "workload": workload_name,
        "replicas": num_replicas,
        "router": router,
        "rate": rate,
        "num_requests": len(result.records),
        "rejected": len(result.rejected),
        "resumed": result.num_resumed,
        "lost_tokens": result.num_lost_tokens,
        "output_throughput": o.output_throughput,
        "request_throughput": o.request_throughput,
        "ttft_p50": o.ttft.p50,
        "ttft_p99": o.ttft.p99,
        "ttft_p99_by_class": {k: c.ttft.p99 for k, c in summary.classes.items()},
        "tpot_p99": o.tpot.p99,
        "prefix_hit_rate": result.prefix_hit_rate,
        "elapsed": result.elapsed,
        "wall_seconds": result.wall_seconds,
        "num_steps": result.num_steps,
        "routed": [r.num_routed for r in result.replicas],
        "failures": list(failures),
    }


def capacity(workload_name: str) -> float:
    """One replica's saturation throughput (requests/s, or programs/s for multi-turn)."""
    n = {"chat": 1500, "long-prompt-mix": 1500, "multi-turn": 150}[workload_name]
    point = run_cluster(workload_name, 1, "least-tokens", math.inf, n)
    if workload_name == "multi-turn":
        calls = point["num_requests"] / n
        return point["request_throughput"] / calls
    return float(point["request_throughput"])


def _run(job: tuple[Any, ...]) -> dict[str, Any]:
    return run_cluster(*job)


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    workloads = args.workloads.split(",")
    routers = args.routers.split(",")
    replicas = [int(n) for n in args.replicas.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        caps = dict(zip(workloads, pool.map(capacity, workloads), strict=True))
        print("one replica's capacity:", {k: round(v, 2) for k, v in caps.items()}, flush=True)
        jobs = [
            (w, n, r, LOAD * caps[w] * n, REQUESTS_PER_REPLICA[w] * n)
            for n in replicas
            for w in workloads
            for r in routers
        ]
        points = list(pool.map(_run, jobs))
        failure_jobs = []
        if args.failures and "multi-turn" in workloads and 8 in replicas:
            rate = LOAD * caps["multi-turn"] * 8
            span = REQUESTS_PER_REPLICA["multi-turn"] * 8 / rate
            fail = ((3, round(span / 3, 1), 10.0),)
            failure_jobs = [
                ("multi-turn", 8, r, rate, REQUESTS_PER_REPLICA["multi-turn"] * 8, 0, fail)
                for r in ("round-robin", "affinity")
            ]
        failures = list(pool.map(_run, failure_jobs))
        scale = []
        if args.scale:
            scale_jobs = [
                ("chat", n, "least-tokens", SCALE_LOAD * caps.get("chat", 0) * n,
                 SCALE_REQUESTS_PER_REPLICA * n)
                for n in SCALE_REPLICAS
            ]  # fmt: skip
            if "chat" not in caps:
                caps["chat"] = capacity("chat")
                scale_jobs = [(w, n, r, SCALE_LOAD * caps["chat"] * n, k)
                              for w, n, r, _, k in scale_jobs]  # fmt: skip
            scale = list(pool.map(_run, scale_jobs))
    return {"capacity": caps, "points": points, "failures": failures, "scale": scale}


def print_sim(data: dict[str, Any]) -> None:
    print(f"\nload {LOAD} x capacity x N; capacity per replica: {data['capacity']}\n")
    print("| replicas | workload | router | out tok/s | p99 TTFT (s) by class | p99 TTFT all | "
          "prefix hits |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for p in data["points"]:
        classes = ", ".join(f"{k} {v:.3f}" for k, v in sorted(p["ttft_p99_by_class"].items()))
        print(
            f"| {p['replicas']} | {p['workload']} | {p['router']} | "
            f"{p['output_throughput']:.0f} | {classes} | {p['ttft_p99']:.3f} | "
            f"{100 * p['prefix_hit_rate']:.1f}% |"
        )
    if data["failures"]:
        print("\n| failure run | router | requests | resumed | lost tokens | rejected | "
              "p99 TTFT (s) | out tok/s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for p in data["failures"]:
            print(
                f"| {p['failures']} | {p['router']} | {p['num_requests']} | {p['resumed']} | "
                f"{p['lost_tokens']} | {p['rejected']} | {p['ttft_p99']:.3f} | "
                f"{p['output_throughput']:.0f} |"
            )
    if data["scale"]:
        base = data["scale"][0]["output_throughput"]
        print("\n| replicas | out tok/s | x one replica | per replica |")
        print("|---|---|---|---|")
        for p in data["scale"]:
            ratio = p["output_throughput"] / base
            print(f"| {p['replicas']} | {p['output_throughput']:.0f} | {ratio:.2f} | "
                  f"{ratio / p['replicas']:.3f} |")  # fmt: skip


# -- real engine ---------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, replicas: int, log: Path, extra: list[str]) -> None:
        import httpx

        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "heddle", "serve", "--num-threads", "1",
               "--port", str(self.port), "--log-level", "warning", *extra]  # fmt: skip
        if replicas > 1:
            cmd += ["--replicas", str(replicas)]
        self.log = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited ({self.proc.returncode}); see {log}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not come up")
            time.sleep(0.5)

    def replica_pids(self) -> list[int]:
        out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True)
        return [int(line.split()[0]) for line in out.stdout.splitlines()
                if "ray::EngineReplica" in line]  # fmt: skip

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        finally:
            self.log.close()


def _bench(base: str, concurrency: int, num_requests: int, seed: int) -> Any:
    from heddle.bench.client import run_bench

    return run_bench(
        base,
        "chat",
        concurrency=concurrency,
        num_requests=num_requests,
        seed=seed,
        vocab_size=49152,
        workload_options={"length_scale": 0.3, "max_prompt_len": 256, "max_output_len": 256},
    )


def _bench_point(result: Any) -> dict[str, Any]:
    o = result.summary.overall
    planned = {r.request_id: r.output_len for r in result.workload_requests}
    got = {r.request_id: r.num_output_tokens for r in result.records}
    return {
        "requests": len(result.records),
        "failed": len(result.errors),
        "errors": list(result.errors.values())[:3],
        "token_mismatches": sum(1 for k, v in planned.items() if got.get(k) != v),
        "output_throughput": o.output_throughput,
        "ttft_p50": o.ttft.p50,
        "ttft_p99": o.ttft.p99,
        "tpot_p50": o.tpot.p50,
        "wall_time": result.wall_time,
    }


def run_real(args: argparse.Namespace) -> dict[str, Any]:
    import threading

    RESULTS.mkdir(parents=True, exist_ok=True)
    extra = ["--max-model-len", "1024", "--num-blocks", "1024", "--max-num-seqs", "32"]
    out: dict[str, Any] = {"concurrency_per_core": args.concurrency, "runs": {}}
    for repeat in range(args.repeats):
        one = _Server(1, RESULTS / "real_one.log", extra)
        try:
            _bench(one.base, 2, 8, 99)  # warm-up
            r1 = _bench_point(_bench(one.base, args.concurrency, args.requests, repeat))
        finally:
            one.stop()
        two = _Server(2, RESULTS / "real_two.log", extra)
        try:
            _bench(two.base, 4, 16, 99)
            r2 = _bench_point(_bench(two.base, 2 * args.concurrency, 2 * args.requests, repeat))
            pids = two.replica_pids()
            timer = threading.Timer(args.kill_after, os.kill, (pids[0], signal.SIGKILL))
            timer.start()
            rk = _bench_point(_bench(two.base, 2 * args.concurrency, 2 * args.requests, repeat))
            timer.cancel()
            rk["killed_pid"] = pids[0]
            rk["kill_after_s"] = args.kill_after
        finally:
            rc = two.stop()
        out["runs"][repeat] = {"one": r1, "two": r2, "two_killed": rk, "exit_code": rc}
        ratio = r2["output_throughput"] / r1["output_throughput"]
        print(f"repeat {repeat}: one {r1['output_throughput']:.1f} tok/s, two "
              f"{r2['output_throughput']:.1f} tok/s (x{ratio:.2f}); killed run: "
              f"{rk['failed']} failed, {rk['token_mismatches']} token mismatches, "
              f"{rk['output_throughput']:.1f} tok/s", flush=True)  # fmt: skip
    ratios = sorted(
        run["two"]["output_throughput"] / run["one"]["output_throughput"]
        for run in out["runs"].values()
    )
    out["median_ratio"] = ratios[len(ratios) // 2]
    return out


def machine() -> dict[str, Any]:
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = " ".join(f for f in line.split() if f.startswith(("avx512", "amx")))
                break
    except OSError:
        model = platform.processor()
    return {"cpu": model, "flags": flags, "cores": os.cpu_count(), "python": sys.version.split()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sim")
    s.add_argument("--replicas", default="8,32")
    s.add_argument("--workloads", default=",".join(WORKLOADS))
    s.add_argument("--routers", default=",".join(ROUTERS))
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--no-scale", action="store_false", dest="scale")
    s.add_argument("--no-failures", action="store_false", dest="failures")
    s.add_argument("--output", default=str(RESULTS / "sim.json"))
    r = sub.add_parser("real")
    r.add_argument("--concurrency", type=int, default=8, help="streams in flight per core")
    r.add_argument("--requests", type=int, default=96, help="requests per core")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--kill-after", type=float, default=8.0, help="seconds into the killed run")
    r.add_argument("--output", default=str(RESULTS / "real.json"))
    args = parser.parse_args()
    started = time.time()
    data = run_sim(args) if args.mode == "sim" else run_real(args)
    data["machine"] = machine()
    data["command"] = " ".join(sys.argv)
    data["seconds"] = time.time() - started
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(data, indent=1, default=str) + "\n")
    if args.mode == "sim":
        print_sim(data)
    else:
        print(json.dumps({k: v for k, v in data.items() if k != "runs"}, indent=1))
    print(f"wrote {args.output} in {data['seconds']:.0f} s; machine: {data['machine']}")


if __name__ == "__main__":
    main()
