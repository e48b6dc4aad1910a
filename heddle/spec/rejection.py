"""Verifying draft tokens against the target model: exact for greedy, distribution-preserving
for sampling (speculative sampling, Leviathan et al. 2023 / Chen et al. 2023).

For k draft tokens d_1..d_k the target model computes, in one forward pass, the logits of the
k + 1 positions that follow the request's known tokens. Greedy: accept while d_i is the target's
argmax, then emit the argmax at the first mismatch (or after d_k): the output is token for
token what plain greedy decoding gives. Sampling: accept d_i with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit a token drawn from
norm(max(0, p_i - q_i)); when all k are accepted emit one drawn from p_{k+1}. Each emitted token
is then distributed exactly as the target's p (the statistical test checks this). A proposer
without a distribution (prompt lookup) is a point mass q = onehot(d_i): acceptance is p_i(d_i)
and the residual is p_i with d_i removed.

`sampling_probs` gives the distribution the plain sampler draws from (temperature, then top-k
renormalized, then top-p over the candidates, as heddle.model.sampler does), so "the target
distribution" is the one the engine samples without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from heddle.request import SamplingParams


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [n, vocab] float32 -> the probabilities [n, vocab] plain sampling uses."""
    if params.temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(
            logits.dtype
        )
    scaled = logits / params.temperature
    vocab = scaled.shape[-1]
    top_k = params.top_k if 0 < params.top_k < vocab else 0
    if not top_k and params.top_p >= 1.0:
        return scaled.softmax(dim=-1)
    values, indices = scaled.sort(dim=-1, descending=True)
    if top_k:
        values[:, top_k:] = float("-inf")
        probs = values.softmax(dim=-1)  # renormalized over the k candidates
    else:
        probs = (values - scaled.logsumexp(dim=-1, keepdim=True)).exp()
    if params.top_p < 1.0:
        before = probs.cumsum(dim=-1) - probs
        drop = before >= params.top_p
        drop[:, 0] = False
        probs = probs.masked_fill(drop, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, indices, probs)


def verify(
    logits: torch.Tensor,
    draft_token_ids: Sequence[int],
    params: SamplingParams,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """logits [k + 1, vocab] of the positions after the known tokens; draft_probs [k, vocab]
    (None: the drafts are point masses). Returns the accepted drafts plus one emitted token
    (1 .. k + 1 tokens)."""
    k = len(draft_token_ids)
    if logits.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} rows of logits for {k} draft tokens, got {logits.shape[0]}")
    if params.temperature == 0.0:
        targets = logits.argmax(dim=-1).tolist()
        out = []
        for i, draft in enumerate(draft_token_ids):
            out.append(targets[i])
            if draft != targets[i]:
                return out
        out.append(targets[k])
        return out
    p = sampling_probs(logits.float(), params)
    uniforms = torch.rand(k + 1, generator=generator, dtype=torch.float64, device=p.device)
    out = []
    for i, draft in enumerate(draft_token_ids):
        p_i = p[i]
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, draft])
        accept = min(1.0, float(p_i[draft]) / q_d) if q_d > 0 else 0.0
        if float(uniforms[i]) < accept:
            out.append(draft)
            continue
        if draft_probs is None:
            residual = p_i.clone()
            residual[draft] = 0.0
        else:
            residual = (p_i - draft_probs[i].to(p_i.dtype)).clamp_(min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q on the support: any draw from p is right
            residual = p_i
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[k], 1, generator=generator)))
    return out
