"""Measure this machine's matmul FLOP/s and memory bandwidth for a `cpu-*` hardware spec.

    python -m heddle.sim.measure_hardware

numpy only (the simulator runs without torch), so it measures fp32 matmul and memcpy. The
bf16 figure in `specs/hardware.cpu-2core.json` was measured once with torch; its command is
recorded in that file's `source`.
"""

from __future__ import annotations

import json
import time

import numpy as np


def matmul_flops(size: int = 1024, repeats: int = 5, dtype: str = "float32") -> float:
    """Best-of-`repeats` FLOP/s of a size x size x size matmul."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(dtype)
    b = rng.standard_normal((size, size)).astype(dtype)
    a @ b  # warm up the BLAS threads
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def memcpy_bandwidth(num_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best-of-`repeats` bytes moved per second (read + write) copying a buffer far past L3."""
    src = np.ones(num_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2.0 * num_bytes / best


def main() -> None:
    result = {
        "fp32_matmul_flops": {str(n): matmul_flops(n) for n in (512, 1024, 2048)},
        "memcpy_bytes_per_s": memcpy_bandwidth(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
