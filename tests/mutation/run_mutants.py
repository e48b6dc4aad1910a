"""Hand-run mutation check (not part of CI): each named mutant must make the fast suite fail.

Each mutant is a small deliberate bug (issue 19's list: what once passed every fast test).
For each, the working tree is copied to a temporary directory, the mutant is applied there
(it must match its source text exactly once, so a stale mutant is reported, never skipped),
and the fast tests run on the copy: first the tests aimed at the mutant, then, should those
pass, the whole fast suite (`-m "not slow"`). A mutant is killed when the tests fail.

    /work/tools/cpu /work/tools/py tests/mutation/run_mutants.py [NAME ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    focus: tuple[str, ...]  # tests aimed at it (run first)


MUTANTS = (
    Mutant(
        "hash-ignores-parent",
        "heddle/core/block_hash.py",
        "return _sha256(parent + packer.pack(*token_ids)).digest()",
        "return _sha256(packer.pack(*token_ids)).digest()",
        ("tests/core/test_kv_cache.py", "tests/core/test_kv_cache_model.py"),
    ),
    Mutant(
        "lookup-continues-past-a-miss",
        "heddle/core/kv_cache.py",
        "            if block is None:\n                break\n",
        "            if block is None:\n                continue\n",
        ("tests/core/test_kv_cache.py", "tests/core/test_kv_cache_model.py"),
    ),
    Mutant(
        "commit-registers-a-partial-block",
        "heddle/core/kv_cache.py",
        "num_full = min(request.num_computed_tokens // self.block_size, len(table))",
        "num_full = min(-(-request.num_computed_tokens // self.block_size), len(table))",
        ("tests/core/test_kv_cache_model.py", "tests/core/test_kv_cache.py"),
    ),
    Mutant(
        "capacity-ignores-reclaimed-cached-blocks",
        "heddle/core/kv_cache.py",
        "if need > 0 and need > self.pool.num_free_blocks - reclaimed:",
        "if need > 0 and need > self.pool.num_free_blocks:",
        ("tests/core/test_kv_cache_model.py",),
    ),
    Mutant(
        "long-prefill-threshold-deleted",
        "heddle/core/step_builder.py",
        "        if self.long_prefill_threshold is not None:\n"
        "            num = min(num, self.long_prefill_threshold)\n",
        "",
        ("tests/core/test_scheduler.py",),
    ),
    Mutant(
        "holdback-of-the-shortest-stop-string",
        "heddle/engine/detokenizer.py",
        "self._holdback = max((len(s) for s in stop), default=1) - 1",
        "self._holdback = min((len(s) for s in stop), default=1) - 1",
        ("tests/engine/test_engine_fake.py",),
    ),
    Mutant(
        "fair-charges-output-for-prefill-chunks",
        "heddle/core/policies/fair.py",
        "            if sample:\n                service += self.output_weight\n",
        "            service += self.output_weight\n",
        ("tests/core/policies/test_fair.py",),
    ),
    Mutant(
        "profiling-sampling-row-stops-short",
        "heddle/model/profiling.py",
        "add(i, num_new, context, context if sample else context + 1, sample)",
        "add(i, num_new, context, context + 1, sample)",
        ("tests/model/test_profiling.py",),
    ),
    Mutant(
        "live-tests-skip-on-any-error",
        "tests/server/live.py",
        "    except ModelNotFoundError as e:\n",
        "    except Exception as e:\n",
        ("tests/server/test_live_helper.py",),
    ),
)


def copy_tree(destination: Path) -> None:
    """Tracked files and untracked ones git does not ignore (the working tree as it is)."""
    listing = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def pytest(tree: Path, targets: list[str]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-m", "not slow", *targets]  # fmt: skip
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return done.returncode, (lines[0] if lines else done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if not args.names or m.name in args.names]
    survivors = []
    with tempfile.TemporaryDirectory(prefix="heddle-mutants-") as scratch:
        base = Path(scratch) / "base"
        copy_tree(base)
        focus = sorted({t for m in mutants for t in m.focus})
        code, summary = pytest(base, focus)
        print(f"unmutated tree, the aimed-at tests: {'pass' if code == 0 else 'FAIL'} ({summary})")
        if code != 0:
            return 2
        for mutant in mutants:
            tree = Path(scratch) / mutant.name
            shutil.copytree(base, tree)
            path = tree / mutant.path
            source = path.read_text()
            if source.count(mutant.old) != 1:
                print(f"{mutant.name:42} STALE: its source text is not in {mutant.path} once")
                survivors.append(mutant.name)
                continue
            path.write_text(source.replace(mutant.old, mutant.new))
            start = time.perf_counter()
            code, summary = pytest(tree, list(mutant.focus))
            where = "aimed-at tests"
            if code == 0:
                code, summary = pytest(tree, ["tests"])
                where = "whole fast suite"
            verdict = "killed" if code != 0 else "SURVIVED"
            print(
                f"{mutant.name:42} {verdict} by the {where} in {time.perf_counter() - start:.0f} s"
                f": {summary}"
            )
            if code == 0:
                survivors.append(mutant.name)
            shutil.rmtree(tree)
    print(f"{len(mutants) - len(survivors)} of {len(mutants)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
