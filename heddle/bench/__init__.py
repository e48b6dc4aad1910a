"""A load client for any OpenAI-compatible server (heddle, llama.cpp's llama-server, vLLM).

`run_bench(base_url, workload, request_rate=... | concurrency=...)` -> BenchResult; the CLI's
`heddle bench serve` uses `add_arguments` and `run_from_args` from heddle.bench.client.
"""

from __future__ import annotations

from heddle.bench.client import add_arguments, parse_slo, run_bench, run_bench_async, run_from_args
from heddle.bench.report import BenchResult

__all__ = [
    "BenchResult",
    "add_arguments",
    "parse_slo",
    "run_bench",
    "run_bench_async",
    "run_from_args",
]
