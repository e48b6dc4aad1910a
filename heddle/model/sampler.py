"""Picks one token per sampling row from float32 logits [num_rows, vocab].

Per row: greedy (temperature 0), or temperature + top-k + top-p sampling, optionally seeded;
min_tokens suppresses EOS and stop ids; optional top-n logprobs of the raw logits. Work is
batched: all greedy rows take one argmax, all random rows one softmax and one exponential
race (argmax of p / Exp(1) noise, equivalent to multinomial sampling), and only seeded rows
draw their noise separately, from their own generator.
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
            raw_logprobs = torch.log_softmax(logits[logprob_rows], dim=-1)

        self._suppress_stops(logits, rows)

        sampled = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
        greedy = [i for i, row in enumerate(rows) if row.params.temperature == 0.0]
        if greedy:
            if len(greedy) == num_rows:
                sampled = logits.argmax(dim=-1)
            else:
                sampled[greedy] = logits[greedy].argmax(dim=-1)
        random_rows = [i for i, row in enumerate(rows) if row.params.temperature != 0.0]
        if random_rows:
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
        """logits: [R, vocab] for rows with temperature > 0 -> sampled ids [R]."""
        device = logits.device
        temperatures = torch.tensor([row.params.temperature for row in rows],
                                    dtype=logits.dtype, device=device)
        logits = logits / temperatures.unsqueeze(1)
        vocab = logits.shape[1]

        top_ks = [row.params.top_k if 0 < row.params.top_k < vocab else 0 for row in rows]
        if any(top_ks):
            k_max = max(top_ks)
            top_values = logits.topk(k_max, dim=-1).values  # [R, k_max], descending
            k_index = torch.tensor([max(k, 1) - 1 for k in top_ks], device=device)
            thresholds = top_values.gather(1, k_index.unsqueeze(1))  # [R, 1]
            no_top_k = torch.tensor([k == 0 for k in top_ks], device=device)
            thresholds = thresholds.masked_fill(no_top_k.unsqueeze(1), float("-inf"))
            logits = logits.masked_fill(logits < thresholds, float("-inf"))

        top_p_rows = [i for i, row in enumerate(rows) if row.params.top_p < 1.0]
        if top_p_rows:
            subset = logits[top_p_rows]
            sorted_logits, order = subset.sort(dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(dim=-1)
            top_ps = torch.tensor([rows[i].params.top_p for i in top_p_rows],
                                  dtype=sorted_probs.dtype, device=device)
            # Drop a token when the tokens ranked above it already reach top_p; the first
            # token is always kept.
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop_sorted = mass_before >= top_ps.unsqueeze(1)
            drop_sorted[:, 0] = False
            drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
            logits[top_p_rows] = subset.masked_fill(drop, float("-inf"))

        probs = logits.softmax(dim=-1)
        noise = torch.empty_like(probs)
        seeded = [i for i, row in enumerate(rows) if row.params.seed is not None]
        unseeded = [i for i, row in enumerate(rows) if row.params.seed is None]
        if len(unseeded) == len(rows):
            noise.exponential_()
        else:
            if unseeded:
                noise[unseeded] = torch.empty_like(noise[unseeded]).exponential_()
            for i in seeded:
                noise[i].exponential_(generator=self._generator(rows[i]))
        # An Exp(1) draw of exactly 0 would turn a zero-probability token into 0/0 = NaN,
        # which argmax would pick.
        noise.clamp_(min=torch.finfo(noise.dtype).tiny)
        return (probs / noise).argmax(dim=-1)

    def _generator(self, row: SamplingRow) -> torch.Generator:
        generator = self._generators.get(row.request_id)
        if generator is None:
            assert row.params.seed is not None
            generator = torch.Generator(device=self.device)
            generator.manual_seed(row.params.seed)
            self._generators[row.request_id] = generator
        return generator
