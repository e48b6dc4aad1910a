"""Optional C kernels, compiled on first use with the system C compiler.

`load_decode_kernel()` returns the paged decode attention of csrc/paged_decode_attention.c
(float32 and bfloat16 caches) and its K/V store, or None when there is no compiler, the build
fails, or HEDDLE_DISABLE_C_KERNELS is set; the torch path in heddle.model.attention is then
used, with identical results up to float rounding. `load_library()` is the same shared object,
which also holds csrc/decode_layer.c (the fused decode layer, heddle.model.fused_decode).
The shared object is cached under
$XDG_CACHE_HOME/heddle (or ~/.cache/heddle), keyed by the source, the flags and the CPU, and
is written atomically so concurrent processes can build it at once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCES = (Path(__file__).parent / "csrc" / "paged_decode_attention.c",
            Path(__file__).parent / "csrc" / "decode_layer.c")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
          "-shared", "-fPIC"]
_SYMBOLS = {torch.float32: "heddle_paged_decode_attention_f32",
            torch.bfloat16: "heddle_paged_decode_attention_bf16"}
_STORE_SYMBOL = "heddle_store_kv"


class DecodeKernel:
    """Decode attention for float32 / bfloat16 CPU caches, reading K/V where they lie in the
    cache; and the store of a step's new K/V into their slots."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = {}
        for dtype, symbol in _SYMBOLS.items():
            function = getattr(library, symbol)
            function.restype = ctypes.c_int
            function.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 9
            self._functions[dtype] = function
        self._store = library.heddle_store_kv
        self._store.restype = ctypes.c_int
        self._store.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4

    def __call__(
        self,
        kv_cache: torch.Tensor,  # [2, KVH, num_blocks, block_size, D] f32/bf16, contiguous
        q: torch.Tensor,  # [batch, KVH, group, D], scaled (computed in float32)
        block_tables: torch.Tensor,  # [batch, max_blocks] int64
        context_lens: torch.Tensor,  # [batch] int64
        sliding_window: int | None,
    ) -> torch.Tensor:
        """-> [batch, KVH, group, D] float32"""
        _, num_kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
        batch, _, group, _ = q.shape
        q = q.to(torch.float32).contiguous()
        block_tables = block_tables.contiguous()
        context_lens = context_lens.contiguous()
        out = torch.empty_like(q)
        status = self._functions[kv_cache.dtype](
            kv_cache.data_ptr(), q.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(),
            out.data_ptr(), batch, num_kv_heads, group, head_dim, num_blocks, block_size,
            block_tables.shape[1], sliding_window or 0, torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError("paged decode kernel: unsupported shape")
        return out

    def store(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              slot_mapping: torch.Tensor) -> None:
        """Write k, v [num_tokens, KVH, D] (the cache's dtype) at slots [num_tokens] int64."""
        _, num_kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
        k, v = k.contiguous(), v.contiguous()
        slot_mapping = slot_mapping.contiguous()
        status = self._store(
            kv_cache.data_ptr(), k.data_ptr(), v.data_ptr(), slot_mapping.data_ptr(),
            k.shape[0], num_kv_heads, num_blocks * block_size,
            head_dim * kv_cache.element_size(),
        )
        if status != 0:
            raise ValueError("store_kv: a slot is outside the cache")

    @staticmethod
    def supports(kv_cache: torch.Tensor, num_heads: int) -> bool:
        _, num_kv_heads, _, block_size, head_dim = kv_cache.shape
        return (kv_cache.device.type == "cpu" and kv_cache.dtype in _SYMBOLS
                and kv_cache.is_contiguous() and num_heads // num_kv_heads <= 16
                and head_dim <= 256 and block_size <= 128)


@functools.cache
def load_decode_kernel() -> DecodeKernel | None:
    """The compiled kernel, or None (then the torch path runs). Built once per process."""
    library = load_library()
    return None if library is None else DecodeKernel(library)


@functools.cache
def load_library() -> ctypes.CDLL | None:
    """The shared object of every C kernel, or None (disabled, no compiler, a failed build)."""
    if os.environ.get("HEDDLE_DISABLE_C_KERNELS"):
        return None
    try:
        return _build(_SOURCES)
    except (OSError, subprocess.SubprocessError) as e:
        logger.info("C kernels unavailable, using torch attention: %s", e)
        return None


def _build(sources: tuple[Path, ...]) -> ctypes.CDLL | None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    key = hashlib.sha256()
    for source in sources:
        key.update(source.read_bytes())
    key.update(" ".join([compiler, *_FLAGS]).encode())
    key.update(_cpu_flags().encode())
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache_dir = cache_root / "heddle" / "kernels"
    target = cache_dir / f"heddle_kernels-{key.hexdigest()[:16]}.so"
    if not target.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            built = Path(tmp) / target.name
            subprocess.run([compiler, *_FLAGS, *map(str, sources), "-o", str(built), "-lm"],
                           check=True, capture_output=True, timeout=120)
            os.replace(built, target)
    # torch is already loaded with its libgomp.so.1: the kernel binds to that same runtime.
    return ctypes.CDLL(str(target))


def _cpu_flags() -> str:
    """-march=native code must not move to another CPU: key the cache by the CPU's flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""
