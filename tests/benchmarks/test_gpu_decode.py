"""benchmarks/gpu_decode.py: its paged attention reads each request's pages where they lie
(checked here on CPU with FlexAttention's eager path against SDPA over the gathered context);
without CUDA the script exits with one line; on a GPU (marked `gpu`) a 2-layer smoke run."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from benchmarks.gpu_decode import PagedMask, paged_attention, scrambled_block_tables
from tests.benchmarks.conftest import BENCHMARKS


def test_paged_attention_reads_the_pages_in_place():
    from torch.nn.attention.flex_attention import flex_attention

    batch, q_heads, kv_heads, head_dim, page, pages_each = 3, 4, 2, 16, 16, 4
    num_pages = batch * pages_each + 2
    tables = scrambled_block_tables(batch, pages_each, num_pages, torch.device("cpu"))
    assert not torch.equal(tables.flatten(), tables.flatten().sort().values)  # scrambled
    torch.manual_seed(0)
    k_cache = torch.randn(1, kv_heads, num_pages * page, head_dim)
    v_cache = torch.randn_like(k_cache)
    lengths = torch.tensor([5, 37, 64])  # inside a page, across pages, every page full
    mask = PagedMask(tables, num_pages, page, q_len=1)
    mask.update(lengths)
    q = torch.randn(batch, q_heads, 1, head_dim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns that it is unfused
        out = paged_attention(q, k_cache, v_cache, mask.block_mask, flex_attention)
    for b in range(batch):
        slots = (tables[b].repeat_interleave(page) * page
                 + torch.arange(page).repeat(pages_each))[: lengths[b]]
        keys = k_cache[0][:, slots].repeat_interleave(q_heads // kv_heads, 0)
        values = v_cache[0][:, slots].repeat_interleave(q_heads // kv_heads, 0)
        expected = F.scaled_dot_product_attention(q[b:b + 1], keys[None], values[None])
        torch.testing.assert_close(out[b:b + 1], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_without_cuda_it_exits_with_one_line():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_decode.py"), "--layers", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpu_decode.py: no CUDA device here (this benchmark needs a GPU)"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_smoke_on_a_gpu():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_decode.py"), "--layers", "2",
                           "--batches", "1", "2", "--steps", "2", "--context", "200",
                           "--prefill-tokens", "128"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "decode batch   2" in done.stdout and "prefill 128 tokens" in done.stdout
