"""Pieces of OpenAI responses built from engine outputs: usage and logprobs in both formats."""

from __future__ import annotations

from typing import Any

from heddle.core.outputs import TokenLogprobs
from heddle.engine.outputs import RequestOutput
from heddle.server.state import ServerState


def usage(outputs: list[RequestOutput]) -> dict[str, Any]:
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outputs)},
    }


def completion_logprobs(
    state: ServerState, logprobs: list[TokenLogprobs], text_offset: int
) -> dict[str, Any]:
    """The legacy completions format: parallel lists of tokens, logprobs and top-n dicts."""
    tokens: list[str] = []
    offsets: list[int] = []
    top: list[dict[str, float]] = []
    for entry in logprobs:
        text = state.token_text(entry.token_id)
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        top.append({state.token_text(t): lp for t, lp in entry.top})
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in logprobs],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def chat_logprobs(state: ServerState, logprobs: list[TokenLogprobs]) -> dict[str, Any]:
    """The chat format: one object per token, each with its top alternatives."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = state.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for entry in logprobs:
        token = item(entry.token_id, entry.logprob)
        token["top_logprobs"] = [item(t, lp) for t, lp in entry.top]
        content.append(token)
    return {"content": content}
