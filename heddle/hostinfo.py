"""Facts about the machine heddle runs on that reports and benchmarks print (torch-free)."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path


def cpuinfo() -> tuple[str, str]:
    """The first CPU's model name and flags line in /proc/cpuinfo (the platform's name and
    no flags where it cannot be read)."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = value.strip()
                break
    except OSError:
        pass
    return model, flags


def cpu_model() -> str:
    """The CPU's model name, e.g. for a benchmark's machine line."""
    return cpuinfo()[0]


# The flags that decide which kernels heddle runs (fp32 vs bf16, AMX), for a machine line.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8")


def machine_line() -> str:
    """A benchmark's machine line: the CPU's model name, which of VECTOR_FLAGS it has, and
    how many CPUs, e.g. 'Intel(R) Xeon(R) Processor [avx2 avx512f ...], 2 CPUs'."""
    model, flags = cpuinfo()
    have = set(flags.split())
    vector = " ".join(f for f in VECTOR_FLAGS if f in have)
    return f"{model} [{vector}], {os.cpu_count()} CPUs"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
