"""Facts about the machine heddle runs on that reports and benchmarks print (torch-free)."""

from __future__ import annotations

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
