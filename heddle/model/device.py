"""Choosing the device and the compute dtype."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from heddle.errors import HeddleError
from heddle.hostinfo import cpuinfo

_DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16,
}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise HeddleError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on CUDA and on CPUs with native bf16 math, else float32.

    Without native bf16 (AVX2, or AVX-512 without BF16) bf16 matmuls are emulated: on a
    2-core AVX2 EPYC, SmolLM2-135M decoding 64 requests took 4.3x longer per step in bf16
    than in float32 (benchmarks/decode_microbench.py); only batch 1, bound by weight bytes,
    was faster in bf16.
    """
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise HeddleError(f"unknown dtype {dtype!r}")
        return _DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


@functools.cache
def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16 present (bf16 dot products in hardware)."""
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        check = getattr(torch.cpu, probe, None)
        if check is not None:
            try:
                if check():
                    return True
            except RuntimeError:
                pass
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


# The SIMD features that decide the fast CPU paths (float32 vs bf16, AMX, VNNI for int8).
_SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
               "amx_bf16", "amx_int8")


def cpu_identity() -> str:
    """The CPU's model name and its full flags line: what code tuned or compiled for this CPU
    must not be reused without (kernel builds, the tuned kernel plan)."""
    model, flags = cpuinfo()
    return f"{model}; {flags}"


def cpu_description() -> str:
    """`<model name>, N cores; flags: ...` from /proc/cpuinfo, for benchmark reports."""
    model, line = cpuinfo()
    flags = line.split()
    simd = " ".join(f for f in _SIMD_FLAGS if f in flags) or "none of avx2/avx512/amx"
    return f"{model}, {os.cpu_count()} cores; flags: {simd}"
