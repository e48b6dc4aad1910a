"""heddle's server vs llama.cpp's llama-server: same GGUF, same workload, same load, one run.

Each server is started as a subprocess on 127.0.0.1 and loaded with `heddle.bench.run_bench`
(streaming /v1/completions, token-id prompts, max_tokens = the workload's output length,
ignore_eos), so both generate exactly the same number of tokens.

1. Closed loop at each concurrency (default 1, 8, 32, 64) on the `random` workload: output
   tokens/s, p50/p99 TTFT and TPOT.
2. The long-prompt mix (mostly short chats, some multi-thousand-token prompts) at a fixed
   request rate: p99 TTFT of the short requests, where llama.cpp's slot scheduling makes short
   prompts wait behind long ones.

With --heddle-before DIR a third server runs heddle from another checkout (e.g. `git archive`
of main before a change), so before, after and llama-server are measured in one run; the
report then adds a ratio table (heddle / llama-server, heddle / heddle-before).

llama-server is optional (without --llama-server only heddle runs). Build it from the PyPI sdist
of llama-cpp-python 0.3.36 (about 6 minutes on 2 cores; never in CI):

    CMAKE_ARGS="-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAVA_BUILD=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF" \
      pip wheel --no-deps llama-cpp-python==0.3.36 --config-settings=build-dir=/tmp/llama-build
    .venv/bin/python benchmarks/serve_vs_llamacpp.py --llama-server /tmp/llama-build/bin/llama-server

That build uses -march=native. On a VM that reports AMX in cpuid but does not enable the tiles
(the Xeon of docs/BENCHMARKS.md), its AMX code dies with SIGILL (`tilezero`); there, add
`-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON` (every
SIMD extension but AMX).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from heddle.bench import BenchResult, run_bench
from heddle.hostinfo import free_port
from heddle.model.device import cpu_description
from heddle.model.registry import default_model_path
from heddle.workloads import get_workload

START_TIMEOUT_S = 600
SERVE_HEDDLE = (
    "import argparse, sys\n"
    "from heddle.server.args import add_arguments, run_from_args\n"
    "parser = argparse.ArgumentParser()\n"
    "add_arguments(parser)\n"
    "sys.exit(run_from_args(parser.parse_args(sys.argv[1:])))\n"
)


class Server:
    """A server subprocess, up once /health answers 200; SIGTERM on exit."""

    def __init__(self, name: str, command: list[str], port: int, log_path: Path,
                 env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.cwd = cwd
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                        env=self.env, cwd=self.cwd)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log_path}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()  # `with` calls __exit__ only after __enter__ returned
        raise RuntimeError(
            f"{self.name} did not come up in {START_TIMEOUT_S} s; see {self.log_path}"
        )

    def __exit__(self, *exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def heddle_server(args: argparse.Namespace, port: int, out: Path, tag: str,
                  source: str | None = None) -> Server:
    """heddle from this tree, or (source) from another checkout, e.g. the code before a change;
    --quantization is passed only to this tree's."""
    command = [
        sys.executable, "-c", SERVE_HEDDLE,
        "--model", str(Path(args.model).resolve()), "--port", str(port), "--log-level", "warning",
        "--max-num-seqs", str(max(args.concurrency)),
        "--max-num-batched-tokens", str(args.max_num_batched_tokens),
        "--num-threads", str(args.threads),
    ]  # fmt: skip
    if source is None:
        if args.quantization:
            command += ["--quantization", args.quantization]
        return Server("heddle", command, port, out / f"heddle-{tag}.log")
    # PYTHONPATH and the working directory: `python -c` puts the cwd first on sys.path.
    source = str(Path(source).resolve())
    env = dict(os.environ, PYTHONPATH=source)
    return Server("heddle-before", command, port, (out / f"heddle-before-{tag}.log").resolve(),
                  env, cwd=source)


def llama_server(
    args: argparse.Namespace, port: int, out: Path, tag: str, slots: int, slot_ctx: int
) -> Server:
    command = [
        args.llama_server, "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(slots), "-c", str(slots * slot_ctx), "-t", str(args.threads),
        "-tb", str(args.threads), "--cont-batching", "--no-webui",
    ]  # fmt: skip
    return Server("llama-server", command, port, out / f"llama-{tag}.log")


def bench(
    server: Server, workload: Any, out: Path, label: str, vocab_size: int, **load: Any
) -> BenchResult:
    # One short request first: lazy initialisation is not part of the measurement.
    warm = get_workload("random", num_requests=1, input_len=16, output_len=4)
    run_bench(server.base_url, warm, concurrency=1, vocab_size=vocab_size, progress=False)
    return run_bench(
        server.base_url,
        workload,
        vocab_size=vocab_size,
        output_dir=out,
        label=label,
        progress=sys.stdout.isatty(),
        **load,
    )


def row(result: BenchResult, request_class: str | None = None) -> dict[str, Any]:
    summary = result.summary.classes[request_class] if request_class else result.summary.overall
    return {
        "completed": summary.num_completed,
        "failed": summary.num_failed,
        "output_tok_s": round(summary.output_throughput, 1),
        "ttft_p50_ms": _ms(summary.ttft.p50),
        "ttft_p99_ms": _ms(summary.ttft.p99),
        "tpot_p50_ms": _ms(summary.tpot.p50),
        "tpot_p99_ms": _ms(summary.tpot.p99),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def concurrency_sweep(args: argparse.Namespace, out: Path) -> dict[str, dict[int, Any]]:
    results: dict[str, dict[int, Any]] = {}
    slot_ctx = args.input_len + args.output_len + 64
    servers = [("heddle", lambda port: heddle_server(args, port, out, "sweep"))]
    if args.heddle_before:
        servers.append(("heddle-before", lambda port: heddle_server(
            args, port, out, "sweep", source=args.heddle_before)))
    if args.llama_server:
        slots = max(args.concurrency)
        servers.append(
            ("llama-server", lambda port: llama_server(args, port, out, "sweep", slots, slot_ctx))
        )
    for name, make in servers:
        results[name] = {}
        with make(free_port()) as server:
            for concurrency in args.concurrency:
                workload = get_workload(
                    "random",
                    seed=args.seed,
                    num_requests=max(args.min_requests, args.requests_per_slot * concurrency),
                    input_len=args.input_len,
                    output_len=args.output_len,
                )
                result = bench(
                    server,
                    workload,
                    out,
                    f"{name}-c{concurrency}",
                    args.vocab_size,
                    concurrency=concurrency,
                    max_duration=args.max_duration,
                )
                results[name][concurrency] = row(result)
                print(name, concurrency, results[name][concurrency], flush=True)
    return results


def long_prompt_run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    workload = get_workload(
        "long-prompt-mix",
        seed=args.seed,
        num_requests=args.long_num_requests,
        rate=args.long_rate,
        long_share=args.long_share,
    )
    slot_ctx = max(r.prompt_len + r.output_len for r in workload) + 64
    servers = [("heddle", lambda port: heddle_server(args, port, out, "long"))]
    if args.llama_server:
        servers.append(
            (
                "llama-server",
                lambda port: llama_server(args, port, out, "long", args.long_slots, slot_ctx),
            )
        )
    for name, make in servers:
        with make(free_port()) as server:
            result = bench(
                server, workload, out, f"{name}-long", args.vocab_size, request_rate=args.long_rate
            )
        results[name] = {cls: row(result, cls) for cls in sorted(result.summary.classes)}
        print(name, "long-prompt mix", results[name], flush=True)
    return results


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Machine: {report['machine']}", "", f"Command: `{report['command']}`", ""]
    lines += [
        "| server | concurrency | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) "
        "| TPOT p50 (ms) | TPOT p99 (ms) | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by_c in report["sweep"].items():
        for c, r in by_c.items():
            lines.append(
                f"| {name} | {c} | {r['output_tok_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} "
                f"| {r['tpot_p50_ms']} | {r['tpot_p99_ms']} | {r['failed']} |"
            )
    lines += ratio_table(report["sweep"])
    if report.get("long"):
        lines += [
            "",
            f"Long-prompt mix at {report['long_rate']} req/s:",
            "",
            "| server | class | completed | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p99 (ms) |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for name, by_class in report["long"].items():
            for cls, r in by_class.items():
                lines.append(
                    f"| {name} | {cls} | {r['completed']} | {r['ttft_p50_ms']} "
                    f"| {r['ttft_p99_ms']} | {r['tpot_p99_ms']} |"
                )
    return "\n".join(lines) + "\n"


def ratio_table(sweep: dict[str, dict[int, Any]]) -> list[str]:
    """Output tok/s ratios, heddle against each other server, per concurrency."""
    others = [name for name in sweep if name != "heddle"]
    if "heddle" not in sweep or not others:
        return []
    lines = ["", "| concurrency | " + " | ".join(f"heddle / {o}" for o in others) + " |",
             "|---:|" + "---:|" * len(others)]
    for c, r in sweep["heddle"].items():
        cells = []
        for other in others:
            theirs = sweep[other].get(c)
            if theirs and theirs["output_tok_s"] and not theirs["failed"] and not r["failed"]:
                cells.append(f"{r['output_tok_s'] / theirs['output_tok_s']:.2f}x")
            else:
                cells.append("-")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", default=None, help="path of the llama-server binary")
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded one)")
    parser.add_argument("--heddle-before", default=None, metavar="DIR",
                        help="also run heddle from this checkout (e.g. main before a change)")
    parser.add_argument("--quantization", default=None, help="heddle's --quantization")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--max-duration", type=float, default=600.0, help="per load level")
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--long-rate", type=float, default=1.0, help="long-prompt mix: req/s")
    parser.add_argument("--long-num-requests", type=int, default=60)
    parser.add_argument("--long-share", type=float, default=0.1)
    parser.add_argument("--long-slots", type=int, default=8, help="llama-server -np, long mix")
    parser.add_argument("--skip-long", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=32000, help="prompt ids below this")
    parser.add_argument("--output-dir", default="benchmarks/results/serve_vs_llamacpp")
    args = parser.parse_args()
    args.model = Path(args.model) if args.model else default_model_path()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": f"{cpu_description()}; {args.threads} threads",
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "model": str(args.model),
        "sweep": concurrency_sweep(args, out),
        "long_rate": args.long_rate,
    }
    if not args.skip_long:
        report["long"] = long_prompt_run(args, out)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
