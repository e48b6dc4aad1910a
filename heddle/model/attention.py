"""Paged attention over a block-table KV cache, in plain torch.

The cache of one layer is ONE tensor holding K and V:

    kv_cache: [2, num_kv_heads, num_blocks, block_size, head_dim]   (0 = K, 1 = V)

Token position `pos` of a request lives at slot
`block_table[pos // block_size] * block_size + pos % block_size` of the
[2, num_kv_heads, num_slots, head_dim] view. Heads come before blocks so that gathering a
request's blocks yields, per head, one contiguous [context, head_dim] slab: the layout SDPA
reads fastest (we measured 1.5-2x slower attention from a [blocks, block_size, heads, dim]
layout, whose gathered keys are strided).

Everything the kernel needs about a step is in `AttentionMetadata` (attention_metadata.py),
built once per step and shared by all layers. `paged_attention` is the one function a faster
kernel would replace.

Tokens of a step are laid out as: single-token rows (decodes) first, then the multi-token
prefill chunks.

Decodes: when the C kernel of heddle.model.kernels is available (float32 or bfloat16 on CPU),
one call per layer attends all decode rows straight from the paged cache, and the same library
stores the step's new K/V. Otherwise (the plain-torch
reference, also used for bf16/fp16 and CUDA) decodes run batched in a few groups of similar
context length: per group and layer, one gather copies the group's blocks (K and V) into a
padded [kv_heads * batch, max_blocks * block_size, head_dim] context, an additive mask hides
the padding, and two batched matmuls do the attention.

Prefill chunks run one by one through SDPA with a causal mask shifted by the cached prefix; a
chunk without a cached prefix attends to its own new K/V directly, without a gather.

Grouped-query attention never repeats K/V: the `group` query heads that share one KV head are
folded into the query-length axis, q: [batch, kv_heads, group * num_tokens, head_dim].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from heddle.model.attention_metadata import AttentionMetadata
from heddle.model.kernels import DecodeKernel


class GatherBuffer:
    """A reusable buffer for gathered K/V. A fresh multi-MB tensor per layer costs page
    faults and kernel zeroing: we measured the gather twice as slow without it."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self._buffer = torch.empty(0, dtype=dtype, device=device)

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        if self._buffer.numel() < numel:
            self._buffer = torch.empty(numel, dtype=self._buffer.dtype,
                                       device=self._buffer.device)
        return self._buffer[:numel].view(shape)


@dataclass(slots=True)
class AttentionBackend:
    """Per-model resources of paged attention."""

    gather_buffer: GatherBuffer
    # Reads decode K/V straight from the cache (heddle.model.kernels); None: the torch path.
    decode_kernel: DecodeKernel | None = None


def write_kv_cache(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Store new K/V [num_tokens, kv_heads, head_dim] at their slots (one copy)."""
    _, num_kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
    slots = kv_cache.view(2, num_kv_heads, num_blocks * block_size, head_dim)
    slots.index_copy_(2, slot_mapping, torch.stack([k, v]).transpose(1, 2))


def gather_blocks(kv_cache: torch.Tensor, block_ids: torch.Tensor,
                  buffer: GatherBuffer | None) -> torch.Tensor:
    """Copy blocks out of the cache: -> [2, KVH, len(block_ids), block_size, D].

    One index_select per (K/V, head) over whole blocks: each copies contiguous
    block_size * head_dim runs, several times faster on CPU than one index_select along
    dim 2 of the 5-d cache.
    """
    two, num_kv_heads, _, block_size, head_dim = kv_cache.shape
    shape = (two, num_kv_heads, block_ids.numel(), block_size, head_dim)
    out = buffer.take(shape) if buffer is not None else kv_cache.new_empty(shape)
    for kind in range(two):
        for head in range(num_kv_heads):
            torch.index_select(kv_cache[kind, head], 0, block_ids, out=out[kind, head])
    return out


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    backend: AttentionBackend | None = None,
) -> torch.Tensor:
    """Write the step's K/V into the paged cache, then attend.

    q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim];
    kv_cache: [2, num_kv_heads, num_blocks, block_size, head_dim].
    Returns [num_tokens, num_heads * head_dim].
    """
    num_tokens, num_heads, head_dim = q.shape
    _, num_kv_heads, _, block_size, _ = kv_cache.shape
    group = num_heads // num_kv_heads
    if backend is not None and backend.decode_kernel is not None:
        backend.decode_kernel.store(kv_cache, k, v, metadata.slot_mapping)
    else:
        write_kv_cache(kv_cache, k, v, metadata.slot_mapping)
    tables = metadata.decode_tables
    if tables is not None:
        if backend is None or backend.decode_kernel is None:
            raise ValueError("metadata built for a decode kernel, but there is none")
        batch = metadata.num_decode_tokens
        attn = backend.decode_kernel(
            kv_cache, q[:batch].view(batch, num_kv_heads, group, head_dim).float() * scale,
            tables.block_tables, tables.context_lens, metadata.sliding_window,
        ).view(batch, num_heads * head_dim)  # float32
        if batch == num_tokens:  # a decode-only step: nothing else to attend
            return attn.to(q.dtype)
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)
    gather_buffer = backend.gather_buffer if backend is not None else None
    if tables is not None:
        out[: metadata.num_decode_tokens] = attn  # (cast to the model's dtype)

    for group_rows in metadata.decode_groups:
        # Two batched matmuls over (head, request) pairs; on CPU this matched or beat SDPA's
        # flash kernel, whose per-(request, head) overhead dominates with `group` query rows.
        batch = group_rows.num_rows
        rows = slice(group_rows.row_start, group_rows.row_start + batch)
        context = group_rows.max_blocks * block_size
        # [2, KVH, batch * max_blocks, bs, D] -> [2, KVH * batch, context, D], contiguous
        kv = gather_blocks(kv_cache, group_rows.block_ids, gather_buffer)
        kv = kv.view(2, num_kv_heads * batch, context, head_dim)
        queries = (q[rows].view(batch, num_kv_heads, group, head_dim).transpose(0, 1)
                   .reshape(num_kv_heads * batch, group, head_dim))
        scores = torch.baddbmm(group_rows.mask, queries, kv[0].transpose(1, 2), alpha=scale)
        attn = torch.bmm(scores.softmax(dim=-1), kv[1])  # [KVH * batch, group, D]
        out[rows] = (attn.view(num_kv_heads, batch, group, head_dim).transpose(0, 1)
                     .reshape(batch, num_heads * head_dim))

    for chunk in metadata.prefills:
        rows = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
        length = chunk.num_tokens
        if chunk.block_ids is None:  # no cached prefix: the new K/V are the whole context
            keys = k[rows].transpose(0, 1).contiguous()  # [KVH, length, D]
            values = v[rows].transpose(0, 1).contiguous()
        else:
            kv = gather_blocks(kv_cache, chunk.block_ids, gather_buffer)
            kv = kv.view(2, num_kv_heads, -1, head_dim)  # [2, KVH, context (padded), D]
            keys, values = kv[0], kv[1]
        # [T, H, D] -> [1, KVH, group * T, D], rows ordered (group, token)
        queries = (
            q[rows].view(length, num_kv_heads, group, head_dim)
            .permute(1, 2, 0, 3)
            .reshape(1, num_kv_heads, group * length, head_dim)
        )
        attn = F.scaled_dot_product_attention(
            queries, keys.unsqueeze(0), values.unsqueeze(0), attn_mask=chunk.mask, scale=scale,
        )  # [1, KVH, group * T, D]
        out[rows] = (
            attn.view(num_kv_heads, group, length, head_dim)
            .permute(2, 0, 1, 3)
            .reshape(length, num_heads * head_dim)
        )
    return out
