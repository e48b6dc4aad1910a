"""Paged attention over a block-table KV cache, in plain torch.

The cache of one layer is two tensors, K and V, each [num_blocks, block_size, num_kv_heads,
head_dim]. Token position `pos` of a request lives at slot
`block_table[pos // block_size] * block_size + pos % block_size` of the flattened
[num_slots, num_kv_heads, head_dim] view.

Everything the kernel needs about a step is in `AttentionMetadata`, built once per step by
`build_attention_metadata` and shared by all layers. `paged_attention` is the one function a
faster kernel would replace.

Tokens of a step are laid out as: all single-token rows (decodes) first, then the multi-token
prefill chunks. Decodes run as ONE batched SDPA call per layer: their K/V are gathered into a
padded [batch, max_context] tensor and a mask hides the padding. Each prefill chunk runs on its
own with a causal mask shifted by its cached prefix.

Grouped-query attention never repeats K/V: the `group` query heads that share one KV head are
folded into the query-length axis, q: [batch, kv_heads, group * num_tokens, head_dim].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillChunk:
    """One request computing several tokens in this step."""

    token_start: int  # offset of its first token in the step's flat token axis
    num_tokens: int
    start_position: int  # tokens already in the cache before this chunk
    context_slots: torch.Tensor | None  # [start_position + num_tokens]; None: no cached prefix
    mask: torch.Tensor | None  # [1, 1, group * num_tokens, context] bool, True = attend


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each new token's K/V goes
    num_decode_tokens: int  # the first rows of the step, one token per request
    decode_slots: torch.Tensor | None  # [num_decodes, max_context] int64, padding -> slot 0
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_context] bool, True = attend
    prefills: list[PrefillChunk]


def build_attention_metadata(
    *,
    decode_positions: list[int],
    decode_block_tables: list[list[int]],
    prefill_starts: list[int],
    prefill_lengths: list[int],
    prefill_block_tables: list[list[int]],
    block_size: int,
    group: int,
    sliding_window: int | None,
    device: torch.device,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Index tensors for one step. Returns the metadata and the positions [num_tokens]."""
    num_decodes = len(decode_positions)
    # Positions of every new token, decodes first.
    positions_list = list(decode_positions)
    for start, length in zip(prefill_starts, prefill_lengths, strict=True):
        positions_list.extend(range(start, start + length))
    positions = torch.tensor(positions_list, dtype=torch.int64)

    tables = decode_block_tables + prefill_block_tables
    max_blocks = max((len(t) for t in tables), default=0)
    # [num_requests, max_blocks], padded with block 0 (never read unmasked)
    table_tensor = torch.zeros((len(tables), max(max_blocks, 1)), dtype=torch.int64)
    for row, table in enumerate(tables):
        if table:
            table_tensor[row, : len(table)] = torch.tensor(table, dtype=torch.int64)

    # Which request each new token belongs to, to look up its block.
    owners = list(range(num_decodes))
    for index, length in enumerate(prefill_lengths):
        owners.extend([num_decodes + index] * length)
    owner_tensor = torch.tensor(owners, dtype=torch.int64)
    slot_mapping = (
        table_tensor[owner_tensor, positions // block_size] * block_size + positions % block_size
    )

    decode_slots = decode_mask = None
    if num_decodes:
        context_lens = torch.tensor(decode_positions, dtype=torch.int64) + 1
        max_context = int(context_lens.max())
        key_positions = torch.arange(max_context, dtype=torch.int64)
        blocks = table_tensor[:num_decodes, : (max_context + block_size - 1) // block_size]
        decode_slots = (
            blocks.repeat_interleave(block_size, dim=1)[:, :max_context] * block_size
            + key_positions % block_size
        )
        valid = key_positions.unsqueeze(0) < context_lens.unsqueeze(1)  # [num_decodes, ctx]
        if sliding_window is not None:
            valid &= key_positions.unsqueeze(0) > (context_lens - 1 - sliding_window).unsqueeze(1)
        decode_mask = valid[:, None, None, :]
        decode_slots = decode_slots.to(device)
        decode_mask = decode_mask.to(device)

    prefills: list[PrefillChunk] = []
    token_start = num_decodes
    for index, (start, length) in enumerate(zip(prefill_starts, prefill_lengths, strict=True)):
        context = start + length
        context_slots = None
        if start > 0:
            table = table_tensor[num_decodes + index, : (context + block_size - 1) // block_size]
            key_positions = torch.arange(context, dtype=torch.int64)
            context_slots = (
                table.repeat_interleave(block_size)[:context] * block_size
                + key_positions % block_size
            ).to(device)
        query_positions = torch.arange(start, context, dtype=torch.int64).unsqueeze(1)
        key_positions = torch.arange(context, dtype=torch.int64).unsqueeze(0)
        allowed = key_positions <= query_positions  # [length, context]
        if sliding_window is not None:
            allowed &= key_positions > query_positions - sliding_window
        # Rows are (group, token): the same mask repeated for each query head of a group.
        mask = allowed.repeat(group, 1)[None, None].to(device)
        prefills.append(PrefillChunk(token_start, length, start, context_slots, mask))
        token_start += length

    metadata = AttentionMetadata(
        slot_mapping=slot_mapping.to(device),
        num_decode_tokens=num_decodes,
        decode_slots=decode_slots,
        decode_mask=decode_mask,
        prefills=prefills,
    )
    return metadata, positions.to(device)


def write_kv_cache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new K/V [num_tokens, kv_heads, head_dim] at their slots (one copy each)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write the step's K/V into the paged cache, then attend.

    q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim];
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim].
    Returns [num_tokens, num_heads * head_dim].
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    write_kv_cache(k_cache, v_cache, k, v, metadata.slot_mapping)
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=q.dtype, device=q.device)

    num_decodes = metadata.num_decode_tokens
    if num_decodes:
        assert metadata.decode_slots is not None
        batch, max_context = metadata.decode_slots.shape
        slots = metadata.decode_slots.reshape(-1)
        # [batch, ctx, kv_heads, D] -> [batch, kv_heads, ctx, D] (a strided view, no copy)
        keys = k_flat.index_select(0, slots).view(batch, max_context, num_kv_heads, head_dim)
        values = v_flat.index_select(0, slots).view(batch, max_context, num_kv_heads, head_dim)
        queries = q[:num_decodes].view(batch, num_kv_heads, group, head_dim)
        attn = F.scaled_dot_product_attention(
            queries, keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=metadata.decode_mask, scale=scale,
        )  # [batch, kv_heads, group, D]
        out[:num_decodes] = attn.reshape(batch, num_heads * head_dim)

    for chunk in metadata.prefills:
        rows = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
        if chunk.context_slots is None:  # no cached prefix: the new K/V are the whole context
            keys, values = k[rows], v[rows]
        else:
            keys = k_flat.index_select(0, chunk.context_slots)
            values = v_flat.index_select(0, chunk.context_slots)
        length = chunk.num_tokens
        # [T, H, D] -> [1, kv_heads, group * T, D], rows ordered (group, token)
        queries = (
            q[rows].view(length, num_kv_heads, group, head_dim)
            .permute(1, 2, 0, 3)
            .reshape(1, num_kv_heads, group * length, head_dim)
        )
        attn = F.scaled_dot_product_attention(
            queries, keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0),
            attn_mask=chunk.mask, scale=scale,
        )  # [1, kv_heads, group * T, D]
        out[rows] = (
            attn.view(num_kv_heads, group, length, head_dim)
            .permute(2, 0, 1, 3)
            .reshape(length, num_heads * head_dim)
        )
    return out
