"""Decode and prefill on one CUDA GPU, Llama-3.1-8B-shaped with random weights (issue 10).

    python benchmarks/gpu_decode.py [--batches 1 8 64] [--context 1024] [--prefill-tokens 2048]
        [--hbm-gbs 4800] [--peak-tflops 989] [--steps 30]

One short command for a lent GPU's minutes (no download: the weights are random bf16 in
Llama-3.1-8B's shapes, 32 layers, hidden 4096, 32 query / 8 KV heads of 128, FFN 14336,
vocabulary 128256: 16.1 GB). Without CUDA it exits with a one-line error.

Decode step, per batch size: each request has `context` tokens in a paged KV cache (pages of
`--page-size` tokens, handed out in a scrambled order); per layer RMSNorm, the fused qkv
projection, RoPE, the K/V store at the step's slots, paged attention, the o projection, the
SwiGLU MLP, then the LM head and greedy argmax. The attention reads K/V where the pages lie:
FlexAttention with a BlockMask built from the block table (each request's kv_indices are its
pages; a mask_mod maps a physical slot back to its position), no gather and no copy of the
context. The step is compiled once per batch size with CUDA graphs (torch.compile
mode="reduce-overhead") and replayed. Printed: the median step time, the weight bytes one step
reads, weight bytes / step time / `--hbm-gbs` (MBU), and the measured device-to-device copy
bandwidth of the same GPU beside it.

Prefill: one `--prefill-tokens` prompt (the chunk attends to itself, causal SDPA), tokens/s
and 2 * params * tokens / time against `--peak-tflops` (bf16 dense; H200: 989).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class Shape:
    num_layers: int = 32
    hidden: int = 4096
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0

    @property
    def qkv_out(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def params(self) -> int:
        per_layer = (self.hidden * self.qkv_out + self.num_heads * self.head_dim * self.hidden
                     + 3 * self.hidden * self.intermediate)
        return self.num_layers * per_layer + self.vocab * self.hidden  # LM head (embedding apart)


class PagedMask:
    """A FlexAttention BlockMask over a physical cache of `num_pages * page_size` slots, for
    queries at the end of each request, built once per batch size and updated in place (so a
    compiled step and its CUDA graph read the same buffers every step).

    block_tables [B, max_pages]: each request's pages in order; seq_lens [B]: tokens in the
    cache, the step's new ones included. The kernel visits exactly each request's pages
    (kv_indices = its block table row); mask_mod maps a physical slot back to its position."""

    def __init__(self, block_tables: torch.Tensor, num_pages: int, page_size: int,
                 q_len: int) -> None:
        from torch.nn.attention.flex_attention import BlockMask

        batch, max_pages = block_tables.shape
        device = block_tables.device
        self.page_size, self.q_len = page_size, q_len
        self.block_tables = block_tables
        self.seq_lens = torch.zeros(batch, dtype=torch.int64, device=device)
        self.kv_num_blocks = torch.zeros(batch, 1, 1, dtype=torch.int32, device=device)
        # physical page -> its logical index in request b (-1: not b's page)
        self.logical = torch.full((batch, num_pages), -1, dtype=torch.int64, device=device)
        self.logical.scatter_(1, block_tables,
                              torch.arange(max_pages, device=device).expand(batch, max_pages))
        logical, seq_lens = self.logical, self.seq_lens

        def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                     kv_idx: torch.Tensor) -> torch.Tensor:
            page = logical[b, kv_idx // page_size]
            position = page * page_size + kv_idx % page_size
            return (page >= 0) & (position <= seq_lens[b] - q_len + q_idx)

        self.block_mask = BlockMask.from_kv_blocks(
            self.kv_num_blocks, block_tables.to(torch.int32).view(batch, 1, 1, max_pages),
            None, None, BLOCK_SIZE=(128, page_size), mask_mod=mask_mod,
            seq_lengths=(q_len, num_pages * page_size))

    def update(self, seq_lens: torch.Tensor) -> None:
        self.seq_lens.copy_(seq_lens)
        self.kv_num_blocks.copy_(((seq_lens + self.page_size - 1) // self.page_size)
                                 .to(torch.int32).view(-1, 1, 1))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_mask: object, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
    """q [B, Hq, q_len, D]; caches [1, Hkv, num_pages * page_size, D] (every request's pages in
    one physical sequence, broadcast over the batch: a view, no copy) -> [B, Hq, q_len, D]."""
    batch = q.shape[0]
    return attend(q, k_cache.expand(batch, -1, -1, -1), v_cache.expand(batch, -1, -1, -1),
                  block_mask=block_mask, enable_gqa=True)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + 1e-5)).to(x.dtype) * weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, 1, T, D // 2] (rotate halves, as Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RandomLlama:
    def __init__(self, shape: Shape, device: torch.device, num_slots: int) -> None:
        self.shape = shape
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, device=device, generator=gen, dtype=torch.bfloat16)
                    * cols ** -0.5)

        s = shape
        self.layers = [{
            "qkv": weight(s.qkv_out, s.hidden), "o": weight(s.hidden, s.num_heads * s.head_dim),
            "gate_up": weight(2 * s.intermediate, s.hidden), "down": weight(s.hidden, s.intermediate),
            "norm1": torch.ones(s.hidden, device=device, dtype=torch.bfloat16),
            "norm2": torch.ones(s.hidden, device=device, dtype=torch.bfloat16),
        } for _ in range(s.num_layers)]
        self.embed = weight(s.vocab, s.hidden)
        self.lm_head = weight(s.vocab, s.hidden)
        self.norm = torch.ones(s.hidden, device=device, dtype=torch.bfloat16)
        self.k_caches = [torch.zeros(1, s.num_kv_heads, num_slots, s.head_dim, device=device,
                                     dtype=torch.bfloat16) for _ in range(s.num_layers)]
        self.v_caches = [torch.zeros_like(k) for k in self.k_caches]
        self.inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=device)
                                                 .float() / s.head_dim))

    def weight_bytes(self) -> int:
        total = sum(w.numel() * w.element_size() for layer in self.layers
                    for key, w in layer.items() if not key.startswith("norm"))
        return total + self.lm_head.numel() * self.lm_head.element_size()

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               block_mask: object, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        """One token per request: tokens, positions, slots [B] -> next tokens [B]."""
        s = self.shape
        batch = tokens.shape[0]
        hidden = F.embedding(tokens, self.embed)  # [B, hidden]
        angles = positions.float().unsqueeze(-1) * self.inv_freq  # [B, D / 2]
        cos = angles.cos().to(hidden.dtype).view(batch, 1, 1, -1)
        sin = angles.sin().to(hidden.dtype).view(batch, 1, 1, -1)
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        for layer, k_cache, v_cache in zip(self.layers, self.k_caches, self.v_caches,
                                           strict=True):
            qkv = F.linear(rms_norm(hidden, layer["norm1"]), layer["qkv"])
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = rope(q.view(batch, 1, s.num_heads, s.head_dim).transpose(1, 2), cos, sin)
            k = rope(k.view(batch, 1, s.num_kv_heads, s.head_dim).transpose(1, 2), cos, sin)
            # K/V store at the step's slots: [Hkv, B, D] into [1, Hkv, slots, D]
            k_cache[0].index_copy_(1, slots, k[:, :, 0].transpose(0, 1))
            v_cache[0].index_copy_(1, slots, v.view(batch, s.num_kv_heads, s.head_dim)
                                   .transpose(0, 1))
            out = paged_attention(q, k_cache, v_cache, block_mask, attend)  # [B, Hq, 1, D]
            hidden = hidden + F.linear(out.transpose(1, 2).reshape(batch, q_size), layer["o"])
            gate, up = F.linear(rms_norm(hidden, layer["norm2"]), layer["gate_up"]).chunk(2, -1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer["down"])
        logits = F.linear(rms_norm(hidden, self.norm), self.lm_head)
        return logits.argmax(-1)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """One prompt [T] attending to itself (no cached prefix): -> the next token."""
        s = self.shape
        length = tokens.shape[0]
        hidden = F.embedding(tokens, self.embed)
        angles = torch.arange(length, device=tokens.device).float().unsqueeze(-1) * self.inv_freq
        cos = angles.cos().to(hidden.dtype).view(1, 1, length, -1)
        sin = angles.sin().to(hidden.dtype).view(1, 1, length, -1)
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        for layer in self.layers:
            qkv = F.linear(rms_norm(hidden, layer["norm1"]), layer["qkv"])
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = rope(q.view(1, length, s.num_heads, s.head_dim).transpose(1, 2), cos, sin)
            k = rope(k.view(1, length, s.num_kv_heads, s.head_dim).transpose(1, 2), cos, sin)
            v = v.view(1, length, s.num_kv_heads, s.head_dim).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            hidden = hidden + F.linear(out.transpose(1, 2).reshape(length, q_size), layer["o"])
            gate, up = F.linear(rms_norm(hidden, layer["norm2"]), layer["gate_up"]).chunk(2, -1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer["down"])
        return F.linear(rms_norm(hidden[-1:], self.norm), self.lm_head).argmax(-1)


def scrambled_block_tables(batch: int, pages_each: int, num_pages: int,
                           device: torch.device) -> torch.Tensor:
    """Each request's pages, handed out in a random order (not contiguous ranges)."""
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(1))
    return order[: batch * pages_each].view(batch, pages_each).to(device)


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 10 * 2 * nbytes / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--page-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--hbm-gbs", type=float, default=4800.0, help="H200: 4.8 TB/s")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense, H200")
    parser.add_argument("--layers", type=int, default=32, help="fewer: a quick smoke run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_decode.py: no CUDA device here (this benchmark needs a GPU)", file=sys.stderr)
        raise SystemExit(2)
    from torch.nn.attention.flex_attention import flex_attention

    device = torch.device("cuda")
    shape = Shape(num_layers=args.layers)
    pages_each = (args.context + args.steps + 2 + args.page_size - 1) // args.page_size
    num_pages = max(args.batches) * pages_each
    model = RandomLlama(shape, device, num_pages * args.page_size)
    weight_bytes = model.weight_bytes()
    bandwidth = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; Llama-3.1-8B-shaped "
          f"({shape.num_layers} layers), random bf16 weights {weight_bytes / 1e9:.2f} GB; "
          f"device copy {bandwidth / 1e9:.0f} GB/s (read + write), --hbm-gbs {args.hbm_gbs:.0f}")
    attend = torch.compile(flex_attention, dynamic=False)
    step = torch.compile(model.decode, mode="reduce-overhead", dynamic=False)
    for batch in args.batches:
        tables = scrambled_block_tables(batch, pages_each, num_pages, device)
        mask = PagedMask(tables, num_pages, args.page_size, q_len=1)
        tokens = torch.randint(0, shape.vocab, (batch,), device=device)
        times = []
        for i in range(args.steps + 3):  # 3 warm-ups: compilation, graph capture
            seq_lens = torch.full((batch,), args.context + i + 1, device=device)
            positions = seq_lens - 1
            slots = (tables.gather(1, (positions // args.page_size).unsqueeze(1)).squeeze(1)
                     * args.page_size + positions % args.page_size)
            mask.update(seq_lens)
            torch.cuda.synchronize()
            start = time.perf_counter()
            tokens = step(tokens, positions, slots, mask.block_mask, attend).clone()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - start)
        median = statistics.median(times)
        print(f"decode batch {batch:>3} context {args.context}: {median * 1e3:.2f} ms/step, "
              f"{batch / median:.0f} tok/s; weights / step = {weight_bytes / median / 1e9:.0f} "
              f"GB/s = MBU {weight_bytes / median / (args.hbm_gbs * 1e9):.1%} of --hbm-gbs")
    prompt = torch.randint(0, shape.vocab, (args.prefill_tokens,), device=device)
    with torch.inference_mode():
        model.prefill(prompt)
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            model.prefill(prompt)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    flops = 2 * shape.params() * args.prefill_tokens
    print(f"prefill {args.prefill_tokens} tokens: {median * 1e3:.1f} ms, "
          f"{args.prefill_tokens / median:.0f} tok/s, {flops / median / 1e12:.0f} TFLOP/s = "
          f"{flops / median / (args.peak_tflops * 1e12):.1%} of --peak-tflops (matmuls only)")


if __name__ == "__main__":
    main()
