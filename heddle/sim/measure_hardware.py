"""Measure this machine's matmul FLOP/s and memory bandwidth for a `cpu-*` hardware spec.

    python -m heddle.sim.measure_hardware            # numpy, and torch when it is installed

numpy (the simulator runs without torch): fp32 matmul and a single-threaded copy. With torch
(imported here only, never by the simulator): fp32 and bf16 matmul and a copy on all of
torch's threads, the way the real engine streams weights; that copy is the bandwidth the
roofline should use for the real engine (and the one benchmarks/offline_throughput.py takes as
its memory floor). `specs/hardware.cpu-2core.json` records this script's output and its date.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SIZES = (512, 1024, 2048)
COPY_BYTES = 256 << 20  # far past any L3 of a small VM


def _best(fn: Callable[[], object], repeats: int) -> float:
    """Best-of-`repeats` seconds of `fn()`, after one untimed call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(size: int = 1024, repeats: int = 5, dtype: str = "float32") -> float:
    """Best-of-`repeats` FLOP/s of a size x size x size numpy matmul."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(dtype)
    b = rng.standard_normal((size, size)).astype(dtype)
    return 2.0 * size**3 / _best(lambda: a @ b, repeats)


def memcpy_bandwidth(num_bytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """Best-of-`repeats` bytes moved per second (read + write) by numpy's (one-thread) copy."""
    src = np.ones(num_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    return 2.0 * num_bytes / _best(lambda: np.copyto(dst, src), repeats)


def torch_figures(repeats: int = 5) -> dict[str, Any] | None:
    """fp32 and bf16 matmul FLOP/s and copy bandwidth with torch, or None without torch."""
    try:
        import torch
    except ImportError:
        return None

    def matmul(size: int, dtype: Any) -> float:
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        return 2.0 * size**3 / _best(lambda: a @ b, repeats)

    src = torch.ones(COPY_BYTES, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "fp32_matmul_flops": {str(n): matmul(n, torch.float32) for n in SIZES},
        "bf16_matmul_flops": {str(n): matmul(n, torch.bfloat16) for n in SIZES},
        "memcpy_bytes_per_s": 2.0 * COPY_BYTES / _best(lambda: dst.copy_(src), repeats),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_flags(wanted: tuple[str, ...] = ISA_FLAGS) -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in wanted if flag in have]
    except OSError:
        pass
    return []


def main() -> None:
    result = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "flags": cpu_flags(),
        "numpy": {
            "fp32_matmul_flops": {str(n): matmul_flops(n) for n in SIZES},
            "memcpy_bytes_per_s": memcpy_bandwidth(),
        },
        "torch": torch_figures(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
