"""Where a step's time goes when the engine loop runs in a thread: py-spy, main thread vs not.

The same closed-loop run of the plain engine loop (benchmarks/serving_path.py's `run_loop`: 32
requests, 128-token prompts, 96 output tokens, greedy) once in the main thread and once in a
second thread of the same process, nothing else running (no asyncio, no HTTP), each under
`py-spy record --native --threads`. Reports the throughput of each run, and for the thread that
ran the loop the share of its samples by leaf frame (native symbols included), so that the
extra time of the threaded run shows where it is spent.

    /work/tools/bench /work/tools/py benchmarks/serving_profile.py
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def target(where: str, concurrency: int, output_len: int, maps_path: str) -> None:
    """The profiled program: warm up, then one measured run in `where` ("main" | "thread")."""
    sys.path.insert(0, str(ROOT))
    from serving_path import run_loop, summarize

    from heddle.engine.engine import Engine
    from heddle.engine.llm import build_config
    from heddle.request import SamplingParams

    engine = Engine.from_config(build_config(max_num_seqs=64))
    rng = random.Random(1)

    def prompts(n: int) -> list[list[int]]:
        return [[rng.randrange(100, 32000) for _ in range(128)] for _ in range(n)]

    warm = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    run_loop(engine, prompts(concurrency), warm, concurrency)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    batch = prompts(concurrency)
    # The parent attaches py-spy now (so the model load is not in the profile) and says go.
    Path(maps_path).write_text(Path("/proc/self/maps").read_text())
    print("READY", flush=True)
    sys.stdin.readline()
    box: dict[str, list] = {}
    if where == "main":
        threading.current_thread().name = "engine-loop"
        box["t"] = run_loop(engine, batch, params, concurrency)
    else:
        thread = threading.Thread(
            target=lambda: box.setdefault("t", run_loop(engine, batch, params, concurrency)),
            name="engine-loop",
        )
        thread.start()
        thread.join()
    result = summarize(where, concurrency, box["t"])
    print(f"RESULT {where} {result.tok_s:.1f} tok/s, TPOT p50 {result.tpot_p50 * 1000:.1f} ms")


def library_of(maps: list[tuple[int, int, str]], address: int) -> str:
    for start, end, name in maps:
        if start <= address < end:
            return Path(name).name or "?"
    return "?"


def read_maps(path: Path) -> list[tuple[int, int, str]]:
    maps = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            maps.append((start, end, parts[5]))
    return maps


def leaf_shares(
    raw: Path, maps: list[tuple[int, int, str]], top: int
) -> tuple[int, list[tuple[str, float]], dict[str, int]]:
    """(samples of the busiest thread, its top leaf frames with their share, samples per thread).

    A native frame without a symbol is named by the library its address lies in."""
    per_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0]
        leaf = re.sub(r" \(.*\)$", "", frames[-1]).strip()
        if re.fullmatch(r"0x[0-9a-f]+", leaf):
            leaf = f"[{library_of(maps, int(leaf, 16))}]"
        per_thread[thread][leaf] += int(count)
    totals = {thread: sum(c.values()) for thread, c in per_thread.items()}
    busiest = max(totals, key=lambda t: totals[t])
    counter = per_thread[busiest]
    total = totals[busiest]
    return total, [(leaf, n / total) for leaf, n in counter.most_common(top)], totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("main", "thread"), help=argparse.SUPPRESS)
    parser.add_argument("--maps", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--output-dir", default="results/serving_profile")
    args = parser.parse_args()
    if args.target:
        target(args.target, args.concurrency, args.output_len, args.maps)
        return
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = [f"command: `{' '.join(sys.argv)}`", ""]
    for where in ("main", "thread"):
        raw = out / f"{where}.txt"
        maps_path = out / f"{where}.maps"
        start = time.perf_counter()
        target_command = [
            sys.executable, __file__, "--target", where, "--maps", str(maps_path),
            "--concurrency", str(args.concurrency), "--output-len", str(args.output_len),
        ]  # fmt: skip
        program = subprocess.Popen(
            target_command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert program.stdin is not None and program.stdout is not None
        while not program.stdout.readline().startswith("READY"):
            pass
        command = [
            py_spy, "record", "-r", str(args.rate), "--native", "--threads", "-f", "raw",
            "-o", str(raw), "--pid", str(program.pid),
        ]  # fmt: skip
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2.0)  # py-spy attached
        program.stdin.write("go\n")
        program.stdin.flush()
        result = next(line for line in program.stdout if line.startswith("RESULT")).strip()
        program.wait()
        spy.wait(60)
        _, leaves, threads = leaf_shares(raw, read_maps(maps_path), args.top)
        report += [
            f"## loop in the {where} thread: {result.removeprefix('RESULT ' + where + ' ')} "
            f"({time.perf_counter() - start:.0f} s with the model load, not profiled)",
            "",
            f"samples per thread: {dict(sorted(threads.items(), key=lambda kv: -kv[1]))}",
            "",
            "| leaf frame of the busiest thread | share |",
            "|---|---:|",
            *(f"| `{leaf[:90]}` | {share:.1%} |" for leaf, share in leaves),
            "",
        ]
    text = "\n".join(report) + "\n"
    (out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
