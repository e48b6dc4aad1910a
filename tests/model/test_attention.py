"""paged_attention vs dense causal attention, on random data and scrambled block tables."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from heddle.model.attention import AttentionBackend, GatherBuffer, paged_attention
from heddle.model.attention_metadata import build_attention_metadata, split_decode_groups
from heddle.model.kernels import load_decode_kernel, load_library

NUM_KV_HEADS, GROUP, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 2, 3, 8, 4, 128


def dense_attention(q, k, v, start, window=None):
    """q [T, H, D] at positions start.., k/v [start + T, KVH, D] -> [T, H * D]."""
    num_tokens = q.shape[0]
    context = k.shape[0]
    keys = k.repeat_interleave(GROUP, dim=1).transpose(0, 1)  # [H, ctx, D]
    values = v.repeat_interleave(GROUP, dim=1).transpose(0, 1)
    query_pos = torch.arange(start, start + num_tokens).unsqueeze(1)
    key_pos = torch.arange(context).unsqueeze(0)
    mask = key_pos <= query_pos
    if window is not None:
        mask &= key_pos > query_pos - window
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)
    return out.transpose(0, 1).reshape(num_tokens, -1)


def backend_for(kind: str, dtype: torch.dtype) -> AttentionBackend | None:
    if kind == "torch":
        return None
    kernel = load_decode_kernel()
    if kernel is None:
        pytest.skip("the C decode kernel does not build here")
    return AttentionBackend(GatherBuffer(dtype, torch.device("cpu")), kernel)


# bf16: inputs are rounded to bf16 for the reference too; what differs is the arithmetic (the
# kernel sums in float32, torch in bf16 matmuls) and the bf16 rounding of the output.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kind", ["torch", "kernel"])
@pytest.mark.parametrize("window", [None, 5])
def test_mixed_decode_and_prefill_step_matches_dense(window, kind, dtype):
    backend = backend_for(kind, dtype)
    torch.manual_seed(0)
    # (cached tokens, new tokens) per request: decodes, a fresh prefill, chunks after a prefix
    requests = [(9, 1), (0, 1), (23, 1), (0, 7), (12, 5), (3, 1), (16, 16), (150, 1), (2, 1)]
    free = list(torch.randperm(NUM_BLOCKS).tolist())
    kv_cache = torch.zeros(2, NUM_KV_HEADS, NUM_BLOCKS, BLOCK_SIZE, HEAD_DIM, dtype=dtype)
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [KVH, blocks, block_size, D]
    histories, tables = [], []
    for cached, new in requests:
        total = cached + new
        table = [free.pop() for _ in range((total + BLOCK_SIZE - 1) // BLOCK_SIZE)]
        k_all = torch.randn(total, NUM_KV_HEADS, HEAD_DIM).to(dtype)
        v_all = torch.randn(total, NUM_KV_HEADS, HEAD_DIM).to(dtype)
        for pos in range(cached):  # the prefix is already in the cache
            block, offset = table[pos // BLOCK_SIZE], pos % BLOCK_SIZE
            k_cache[:, block, offset], v_cache[:, block, offset] = k_all[pos], v_all[pos]
        histories.append((k_all, v_all))
        tables.append(table)
    decodes = sorted((i for i, (_, new) in enumerate(requests) if new == 1),
                     key=lambda i: -requests[i][0])
    prefills = [i for i, (_, new) in enumerate(requests) if new > 1]
    order = decodes + prefills
    metadata, positions = build_attention_metadata(
        decode_positions=[requests[i][0] for i in decodes],
        decode_block_tables=[tables[i] for i in decodes],
        prefill_starts=[requests[i][0] for i in prefills],
        prefill_lengths=[requests[i][1] for i in prefills],
        prefill_block_tables=[tables[i] for i in prefills],
        block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, group=GROUP, sliding_window=window,
        dtype=dtype, device=torch.device("cpu"), decode_kernel=backend is not None,
    )
    q = torch.randn(sum(requests[i][1] for i in order), NUM_KV_HEADS * GROUP, HEAD_DIM).to(dtype)
    k_new = torch.cat([histories[i][0][requests[i][0]:] for i in order])
    v_new = torch.cat([histories[i][1][requests[i][0]:] for i in order])
    out = paged_attention(q, k_new, v_new, kv_cache, metadata, HEAD_DIM ** -0.5, backend)
    if backend is None:
        assert len(metadata.decode_groups) == 2  # the 151-token request attends on its own
    else:
        assert metadata.decode_groups == [] and metadata.decode_tables is not None

    expected_positions = [p for i in order for p in range(requests[i][0], sum(requests[i]))]
    assert positions.tolist() == expected_positions
    row = 0
    for i in order:
        cached, new = requests[i]
        k_all, v_all = histories[i]
        expected = dense_attention(q[row:row + new].float(), k_all.float(), v_all.float(),
                                   cached, window)
        tolerance = TOLERANCE[dtype]
        assert out.dtype == dtype
        torch.testing.assert_close(out[row:row + new].float(), expected, atol=tolerance,
                                   rtol=tolerance)
        row += new
    # The new K/V landed in their slots.
    for i in order:
        cached, new = requests[i]
        for pos in range(cached, cached + new):
            block, offset = tables[i][pos // BLOCK_SIZE], pos % BLOCK_SIZE
            assert torch.equal(k_cache[:, block, offset], histories[i][0][pos])
            assert torch.equal(v_cache[:, block, offset], histories[i][1][pos])


def test_decode_groups_split_only_when_padding_costs_more_than_a_group():
    assert split_decode_groups([]) == []
    assert split_decode_groups([5, 5, 5, 4]) == [(0, 4)]
    # One long request among short ones: padding 7 short rows to 60 blocks costs more than a
    # second group.
    assert split_decode_groups([60, 3, 3, 3, 2, 2, 2, 2], overhead=16) == [(0, 1), (1, 8)]
    lengths = sorted(range(1, 65), reverse=True)
    groups = split_decode_groups(lengths, overhead=32)
    assert groups[0][0] == 0 and groups[-1][1] == 64
    assert all(a[1] == b[0] for a, b in itertools.pairwise(groups))

    def cost(split):
        return sum((j - i) * max(lengths[i:j]) + 32 for i, j in split)

    assert cost(groups) < cost([(0, 64)])
    assert cost(groups) <= min(cost([(0, k), (k, 64)]) for k in range(1, 64))


def test_decode_kernel_falls_back_to_torch_when_disabled_or_unbuildable(monkeypatch, tmp_path):
    load_decode_kernel.cache_clear()
    load_library.cache_clear()
    try:
        monkeypatch.setenv("HEDDLE_DISABLE_C_KERNELS", "1")
        assert load_decode_kernel() is None
        load_decode_kernel.cache_clear()
        load_library.cache_clear()
        monkeypatch.delenv("HEDDLE_DISABLE_C_KERNELS")
        monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached there
        assert load_decode_kernel() is None
    finally:
        load_decode_kernel.cache_clear()
        load_library.cache_clear()
