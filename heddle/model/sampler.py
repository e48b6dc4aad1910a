"""Picks one token per sampling row from float32 logits [num_rows, vocab].

Per row: greedy (temperature 0), or temperature + top-k + top-p sampling, optionally seeded;
min_tokens suppresses EOS and stop ids; optional top-n logprobs of the raw logits. Work is
batched: all greedy rows take one argmax; random rows are sampled by inverse CDF (one uniform
number per row, drawn from the row's own generator when it is seeded), over the whole
vocabulary or, with top-k/top-p, over the best candidates of one topk call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from heddle.core.outputs import TokenLogprobs
from heddle.request import SamplingParams


@dataclass(slots=True)
class SamplingRow:
    """What the sampler needs to know about one row."""

    request_id: str
    params: SamplingParams
    num_output_tokens: int  # output tokens before this one
    eos_token_id: int | None


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Seeded requests keep their generator across steps; dropped when they finish.
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._generators.pop(request_id, None)

    @property
    def num_generators(self) -> int:
        return len(self._generators)

    def sample(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow]
    ) -> tuple[list[int], dict[int, TokenLogprobs]]:
        """logits: [len(rows), vocab] float32 (modified in place).

        Returns the sampled token of each row, and TokenLogprobs for rows that asked for them.
        """
        num_rows = len(rows)
        if num_rows == 0:
            return [], {}
        logprob_rows = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        raw_logprobs = None
        if logprob_rows:  # log-softmax of the logits as the model produced them
            raw_logprobs = torch.log_softmax(_rows(logits, logprob_rows), dim=-1)

        self._suppress_stops(logits, rows)

        greedy = [i for i, row in enumerate(rows) if row.params.temperature == 0.0]
        random_rows = [i for i, row in enumerate(rows) if row.params.temperature != 0.0]
        if not random_rows:
            sampled = logits.argmax(dim=-1)
        elif not greedy:
            sampled = self._sample_random(logits, rows)
        else:
            sampled = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
            sampled[greedy] = logits[greedy].argmax(dim=-1)
            sampled[random_rows] = self._sample_random(
                logits[random_rows], [rows[i] for i in random_rows]
            )
        token_ids = sampled.tolist()

        logprobs: dict[int, TokenLogprobs] = {}
        if raw_logprobs is not None:
            top_n = max(rows[i].params.logprobs or 0 for i in logprob_rows)
            index = torch.tensor(logprob_rows, device=logits.device)
            chosen = raw_logprobs.gather(1, sampled[index].unsqueeze(1)).squeeze(1).tolist()
            top_values, top_ids = (raw_logprobs.topk(top_n, dim=-1) if top_n
                                   else (raw_logprobs[:, :0], raw_logprobs[:, :0].long()))
            top_values_list, top_ids_list = top_values.tolist(), top_ids.tolist()
            for k, row_index in enumerate(logprob_rows):
                n = rows[row_index].params.logprobs or 0
                logprobs[row_index] = TokenLogprobs(
                    token_id=token_ids[row_index],
                    logprob=chosen[k],
                    top=list(zip(top_ids_list[k][:n], top_values_list[k][:n], strict=True)),
                )
        return token_ids, logprobs

    def _suppress_stops(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        """Rows below min_tokens may not pick EOS or a stop token id."""
        row_index: list[int] = []
        token_index: list[int] = []
        for i, row in enumerate(rows):
            if row.num_output_tokens >= row.params.min_tokens:
                continue
            stops = set(row.params.stop_token_ids)
            if row.eos_token_id is not None:
                stops.add(row.eos_token_id)
            for token_id in stops:
                if 0 <= token_id < logits.shape[1]:
                    row_index.append(i)
                    token_index.append(token_id)
        if row_index:
            logits[row_index, token_index] = float("-inf")

    def _sample_random(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """logits: [R, vocab] for rows with temperature > 0 -> sampled ids [R].

        Inverse-CDF sampling: one uniform number per row picks a token from the cumulative
        distribution, so a step draws R random numbers, not R * vocab. Rows with top-k or
        top-p only look at their best candidates (one topk call), never sorting the vocab.
        """
        device = logits.device
        num_rows, vocab = logits.shape
        temperatures = torch.tensor([row.params.temperature for row in rows],
                                    dtype=logits.dtype, device=device)
        scaled = logits.div_(temperatures.unsqueeze(1))  # logits are ours to modify
        uniforms = self._uniforms(rows, device)

        plain = [i for i, row in enumerate(rows)
                 if not 0 < row.params.top_k < vocab and row.params.top_p >= 1.0]
        plain_set = set(plain)
        restricted = [i for i in range(num_rows) if i not in plain_set]
        if not restricted:
            return _inverse_cdf(scaled.softmax(dim=-1), uniforms)
        sampled = torch.empty(num_rows, dtype=torch.int64, device=device)
        if plain:
            sampled[plain] = _inverse_cdf(scaled[plain].softmax(dim=-1), uniforms[plain])
        sampled[restricted] = _sample_candidates(
            _rows(scaled, restricted),
            [rows[i].params.top_k if 0 < rows[i].params.top_k < vocab else 0
             for i in restricted],
            [rows[i].params.top_p for i in restricted],
            uniforms[restricted],
        )
        return sampled

    def _uniforms(self, rows: Sequence[SamplingRow], device: torch.device) -> torch.Tensor:
        """One number in (0, 1] per row; seeded rows draw from their own generator."""
        uniforms = torch.rand(len(rows), device=device, dtype=torch.float64)
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                uniforms[i] = torch.rand((), generator=self._generator(row), device=device,
                                         dtype=torch.float64)
        return 1.0 - uniforms

    def _generator(self, row: SamplingRow) -> torch.Generator:
        generator = self._generators.get(row.request_id)
        if generator is None:
            assert row.params.seed is not None
            generator = torch.Generator(device=self.device)
            generator.manual_seed(row.params.seed)
            for _ in range(row.params.seed_offset):  # resumed after that many draws
                torch.rand((), generator=generator, device=self.device, dtype=torch.float64)
            self._generators[row.request_id] = generator
        return generator


# Top-p rows without top-k look among their best TOP_P_WIDTHS[0] tokens, then among more if
# those hold less than top_p of the mass, and sort the whole vocabulary only as a last resort
# (a very flat distribution). topk(64) over a 49k vocabulary is ~40x cheaper than a sort.
TOP_P_WIDTHS = (64, 1024)


def _sample_candidates(logits: torch.Tensor, top_ks: list[int], top_ps: list[float],
                       uniforms: torch.Tensor) -> torch.Tensor:
    """Sample rows [R, vocab] restricted by top-k (0: none) and/or top-p (1.0: none)."""
    num_rows, vocab = logits.shape
    choice = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    pending = list(range(num_rows))
    for top_p_width in (*TOP_P_WIDTHS, vocab):
        widths = [k if k > 0 else min(top_p_width, vocab) for k in
                  (top_ks[i] for i in pending)]
        picked, short = _sample_top(
            _rows(logits, pending) if len(pending) < num_rows else logits, widths,
            [top_ks[i] > 0 for i in pending], [top_ps[i] for i in pending], uniforms[pending],
        )
        choice[pending] = picked
        pending = [pending[j] for j in short]
        if not pending or top_p_width >= vocab:
            break
    return choice


def _sample_top(logits: torch.Tensor, widths: list[int], has_top_k: list[bool],
                top_ps: list[float], uniforms: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Sample each row among its `widths[i]` best tokens, with top-p.

    Returns the picks and the rows (top-p only) whose candidates hold less than top_p of the
    mass: their picks are not valid and must be redone with more candidates.
    """
    device = logits.device
    width = max(widths)
    values, indices = logits.topk(width, dim=-1)  # [R, width], best first
    ranks = torch.arange(width, device=device)
    limits = torch.tensor(widths, device=device)
    values = values.masked_fill(ranks >= limits.unsqueeze(1), float("-inf"))
    top_k_rows = torch.tensor(has_top_k, device=device)
    # With top-k the distribution is renormalized over the k candidates; with top-p alone
    # the candidates keep their probabilities under the whole vocabulary.
    if all(has_top_k):
        normalizer = values.logsumexp(dim=-1)
    else:
        normalizer = torch.where(top_k_rows, values.logsumexp(dim=-1), logits.logsumexp(dim=-1))
    probs = (values - normalizer.unsqueeze(1)).exp()
    cumulative = probs.cumsum(dim=-1)
    top_p = torch.tensor(top_ps, dtype=probs.dtype, device=device).unsqueeze(1)
    # Drop a token when the tokens ranked above it already reach top_p (the first is kept).
    drop = (cumulative - probs) >= top_p
    drop[:, 0] = False
    probs = probs.masked_fill(drop, 0.0)
    picks = indices.gather(1, _inverse_cdf(probs, uniforms).unsqueeze(1)).squeeze(1)
    short = ((cumulative[:, -1] < top_p.squeeze(1)) & ~top_k_rows).nonzero().flatten().tolist()
    return picks, short


# Bit b of byte value v: [256, 8]. A packed bitmask read as bytes indexes it to unpack.
_BYTE_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).bool()


def apply_token_bitmask(
    logits: torch.Tensor, row_indices: list[int], bitmask: torch.Tensor
) -> None:
    """logits[row_indices[i], j] = -inf wherever bit j of bitmask[i] is clear (in place).

    bitmask: int32 [len(row_indices), ceil(vocab / 32)], token j at bit j % 32 of word j // 32
    (xgrammar's layout). Read as little-endian bytes, byte k of a row holds tokens 8k..8k+7.
    """
    if not row_indices:
        return
    vocab = logits.shape[1]
    table = _BYTE_BITS.to(logits.device)
    as_bytes = bitmask.to(logits.device).contiguous().view(torch.uint8).long()
    blocked = ~table[as_bytes].flatten(1)[:, :vocab]  # [rows, vocab] True: not allowed
    for i, row in enumerate(row_indices):
        logits[row].masked_fill_(blocked[i], float("-inf"))


def _rows(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """tensor[rows], without a copy when `rows` is every row in order."""
    if len(rows) == tensor.shape[0] and rows == list(range(len(rows))):
        return tensor
    return tensor[rows]


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs [R, n] (unnormalized, >= 0), uniforms [R] in (0, 1] -> column index [R].

    Picks the first column whose cumulative mass reaches u * total: a column of zero mass is
    never picked, because u > 0.
    """
    cumulative = probs.cumsum(dim=-1)
    targets = uniforms.to(cumulative.dtype) * cumulative[:, -1]
    index = torch.searchsorted(cumulative, targets.unsqueeze(1)).squeeze(1)
    return index.clamp_(max=probs.shape[1] - 1)
