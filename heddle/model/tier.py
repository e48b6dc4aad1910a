"""The second KV tier's memory: a bounded buffer outside the paged KV cache, and its copies.

Beside a GPU pool the buffer is pinned host memory (the copies cross PCIe); on a CPU-only
engine it is a second tensor in host memory (the copies cost memory bandwidth). Which block
goes to which slot is decided in heddle/sessions/tier.py; this only moves the bytes, before the
step's forward pass (out-copies first), and measures what the copies cost.

A buffer per layer has the cache's layout with slots for blocks:
[2 (K, V), num_kv_heads, num_slots, block_size, head_dim].
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

_EWMA = 0.2  # weight of a new copy's bandwidth in the running estimate
_PROBE_BLOCKS = 8


class HostTier:
    def __init__(self, caches: Sequence[torch.Tensor], num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("a second tier needs at least one slot")
        cache = caches[0]
        self.device = cache.device
        shape = (*cache.shape[:2], num_slots, *cache.shape[3:])
        pin = self.device.type == "cuda"
        self.buffers = [
            torch.zeros(shape, dtype=cache.dtype, device="cpu", pin_memory=pin) for _ in caches
        ]
        self.num_slots = num_slots
        per_layer = cache[:, :, 0].numel() * cache.element_size()
        self.block_bytes = per_layer * len(caches)  # one block, K and V, every layer
        self.bytes_copied = 0
        self.copy_seconds = 0.0
        self.bandwidth = 0.0
        self.bandwidth = self._probe(caches)  # bytes/s, updated by every copy

    @classmethod
    def for_caches(cls, caches: Sequence[torch.Tensor], num_slots: int) -> HostTier | None:
        return cls(caches, num_slots) if num_slots > 0 else None

    def copy(
        self,
        caches: Sequence[torch.Tensor],
        offload: Sequence[tuple[int, int]],
        restore: Sequence[tuple[int, int]],
    ) -> None:
        """Copy (block, slot) pairs of `offload` out of the caches, then (slot, block) pairs of
        `restore` into them."""
        start = time.perf_counter()
        num_blocks = len(offload) + len(restore)
        with torch.inference_mode():
            if offload:
                blocks = torch.tensor([b for b, _ in offload], device=self.device)
                slots = torch.tensor([s for _, s in offload])
                self._check(blocks, slots, caches[0].shape[2])
                for cache, buffer in zip(caches, self.buffers, strict=True):
                    buffer.index_copy_(2, slots, cache.index_select(2, blocks).to("cpu"))
            if restore:
                slots = torch.tensor([s for s, _ in restore])
                blocks = torch.tensor([b for _, b in restore], device=self.device)
                self._check(blocks, slots, caches[0].shape[2])
                for cache, buffer in zip(caches, self.buffers, strict=True):
                    staged = buffer.index_select(2, slots)
                    if self.device.type == "cuda":
                        staged = staged.pin_memory()
                    cache.index_copy_(2, blocks, staged.to(self.device, non_blocking=True))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        self._account(num_blocks, time.perf_counter() - start)

    def _check(self, blocks: torch.Tensor, slots: torch.Tensor, num_pool_blocks: int) -> None:
        if int(slots.min()) < 0 or int(slots.max()) >= self.num_slots:
            raise ValueError(f"a second-tier slot outside 0..{self.num_slots - 1}")
        if int(blocks.min()) < 0 or int(blocks.max()) >= num_pool_blocks:
            raise ValueError(f"a KV block id outside 0..{num_pool_blocks - 1}")

    def _account(self, num_blocks: int, seconds: float) -> None:
        copied = num_blocks * self.block_bytes
        self.bytes_copied += copied
        self.copy_seconds += seconds
        if seconds > 0:
            self.bandwidth = (1 - _EWMA) * self.bandwidth + _EWMA * copied / seconds

    def _probe(self, caches: Sequence[torch.Tensor]) -> float:
        """A first bandwidth estimate: the best of three round trips of a few blocks."""
        n = min(_PROBE_BLOCKS, self.num_slots, caches[0].shape[2])
        pairs = [(i, i) for i in range(n)]
        saved = [buffer[:, :, :n].clone() for buffer in self.buffers]
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            self.copy(caches, pairs, pairs)  # out and back in: the cache is unchanged
            best = min(best, time.perf_counter() - start)
        for buffer, old in zip(self.buffers, saved, strict=True):
            buffer[:, :, :n] = old
        self.bytes_copied, self.copy_seconds = 0, 0.0
        return 2 * n * self.block_bytes / max(best, 1e-9)
