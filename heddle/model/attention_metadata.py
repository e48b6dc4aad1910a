"""What paged attention needs to know about one step, built once and shared by all layers.

Tokens of a step are laid out as: single-token rows (decodes) first, then multi-token prefill
chunks. Decodes are split into a few groups of similar context length (`split_decode_groups`),
so that one long request does not make every other request gather and attend over padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Fixed cost of one more decode group, in gathered blocks: a group costs ~10 op launches per
# layer (~100-200 us on CPU), about what gathering and attending over 16-32 blocks of one
# request costs (measured ~6 us per block on one core).
GROUP_OVERHEAD_BLOCKS = 32


@dataclass(slots=True)
class DecodeGroup:
    """Consecutive single-token rows attended together, padded to the group's longest."""

    row_start: int
    num_rows: int
    block_ids: torch.Tensor  # [num_rows * max_blocks] int64: block tables, padded with block 0
    max_blocks: int
    mask: torch.Tensor  # [kv_heads * num_rows, 1, max_blocks * block_size] additive: 0 / -inf


@dataclass(slots=True)
class PrefillChunk:
    """One request computing several tokens in this step."""

    token_start: int  # offset of its first token in the step's flat token axis
    num_tokens: int
    start_position: int  # tokens already in the cache before this chunk
    block_ids: torch.Tensor | None  # [num_blocks] covering the context; None: no cached prefix
    mask: torch.Tensor  # [group * num_tokens, keys] additive: 0 / -inf


@dataclass(slots=True)
class DecodeTables:
    """All single-token rows at once, for a kernel that reads the paged cache directly."""

    block_tables: torch.Tensor  # [num_decodes, max_blocks] int64, padded with block 0
    context_lens: torch.Tensor  # [num_decodes] int64


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each new token's K/V goes
    num_decode_tokens: int  # the first rows of the step, one token per request
    decode_groups: list[DecodeGroup]  # for the torch path
    prefills: list[PrefillChunk]
    decode_tables: DecodeTables | None = None  # for a decode kernel (then no groups)
    sliding_window: int | None = None


def _padded(tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
    """The first `lengths[i]` block ids of each table, padded with block 0 to the longest."""
    width = max(lengths)
    return [list(t[:n]) + [0] * (width - n) for t, n in zip(tables, lengths, strict=True)]


def build_attention_metadata(
    *,
    decode_positions: list[int],
    decode_block_tables: list[list[int]],
    prefill_starts: list[int],
    prefill_lengths: list[int],
    prefill_block_tables: list[list[int]],
    block_size: int,
    num_kv_heads: int,
    group: int,
    sliding_window: int | None,
    dtype: torch.dtype,
    device: torch.device,
    decode_kernel: bool = False,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Index and mask tensors for one step. Returns the metadata and positions [num_tokens].

    With `decode_kernel`, decode rows get block tables and context lengths (DecodeTables);
    otherwise gather groups, formed in the order given: pass decode rows sorted by context
    length for the best groups.
    """
    num_decodes = len(decode_positions)
    positions_list = list(decode_positions)
    for start, length in zip(prefill_starts, prefill_lengths, strict=True):
        positions_list.extend(range(start, start + length))
    positions = torch.tensor(positions_list, dtype=torch.int64)

    # Slot of every new token: its block (from its request's table) and offset.
    token_blocks = [table[pos // block_size]
                    for pos, table in zip(decode_positions, decode_block_tables, strict=True)]
    for start, length, table in zip(prefill_starts, prefill_lengths, prefill_block_tables,
                                    strict=True):
        token_blocks.extend(table[pos // block_size] for pos in range(start, start + length))
    slot_mapping = (torch.tensor(token_blocks, dtype=torch.int64) * block_size
                    + positions % block_size)

    num_blocks = [pos // block_size + 1 for pos in decode_positions]
    decode_tables = None
    if decode_kernel and num_decodes:
        decode_tables = DecodeTables(
            torch.tensor(_padded(decode_block_tables, num_blocks), dtype=torch.int64).to(device),
            torch.tensor(decode_positions, dtype=torch.int64).add_(1).to(device),
        )
    decode_groups = []
    # The kernel reads the paged cache itself: no gather groups then.
    for row_start, row_end in [] if decode_kernel else split_decode_groups(num_blocks):
        rows = slice(row_start, row_end)
        max_blocks = max(num_blocks[rows])
        block_ids = torch.tensor(_padded(decode_block_tables[rows], num_blocks[rows]),
                                 dtype=torch.int64).reshape(-1)
        key_positions = torch.arange(max_blocks * block_size).unsqueeze(0)
        query_positions = torch.tensor(decode_positions[row_start:row_end]).unsqueeze(1)
        allowed = key_positions <= query_positions  # [rows, keys]
        if sliding_window is not None:
            allowed &= key_positions > query_positions - sliding_window
        # The same mask for each KV head: rows ordered (head, request) like the gathered K/V.
        mask = _additive(allowed, dtype).unsqueeze(1).repeat(num_kv_heads, 1, 1)
        decode_groups.append(DecodeGroup(row_start, row_end - row_start, block_ids.to(device),
                                         max_blocks, mask.to(device)))

    prefills: list[PrefillChunk] = []
    token_start = num_decodes
    for start, length, table in zip(prefill_starts, prefill_lengths, prefill_block_tables,
                                    strict=True):
        chunk_block_ids = None
        num_keys = length  # no cached prefix: the keys are the chunk's own tokens
        if start > 0:
            chunk_blocks = (start + length + block_size - 1) // block_size
            chunk_block_ids = torch.tensor(table[:chunk_blocks], dtype=torch.int64).to(device)
            num_keys = chunk_blocks * block_size
        key_positions = torch.arange(num_keys).unsqueeze(0)  # positions 0.. either way
        query_positions = torch.arange(start, start + length).unsqueeze(1)
        allowed = key_positions <= query_positions  # [length, keys]
        if sliding_window is not None:
            allowed &= key_positions > query_positions - sliding_window
        # Rows are (group, token): the same mask repeated for each query head of a group.
        mask = _additive(allowed, dtype).repeat(group, 1).to(device)
        prefills.append(PrefillChunk(token_start, length, start, chunk_block_ids, mask))
        token_start += length

    metadata = AttentionMetadata(slot_mapping.to(device), num_decodes, decode_groups, prefills,
                                 decode_tables, sliding_window)
    return metadata, positions.to(device)


def split_decode_groups(num_blocks: list[int],
                        overhead: int = GROUP_OVERHEAD_BLOCKS) -> list[tuple[int, int]]:
    """Split rows into consecutive groups minimizing padded work.

    A group [i, j) costs (j - i) * max(num_blocks[i:j]) + overhead. Exact dynamic program
    over the given order: O(n^2), n = decode rows of a step (at most max_num_seqs).
    """
    n = len(num_blocks)
    if n == 0:
        return []
    best = [0] + [1 << 62] * n  # best[j]: cost of rows [0, j)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = 0
        for i in range(j - 1, -1, -1):  # last group is [i, j)
            longest = max(longest, num_blocks[i])
            cost = best[i] + (j - i) * longest + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups = []
    j = n
    while j > 0:
        groups.append((cut[j], j))
        j = cut[j]
    return groups[::-1]


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
