"""One streaming /v1/chat/completions request, timed into a RequestRecord, with what it said.

Like heddle.bench.stream (the /v1/completions client) but for the chat API: it keeps the text
and the tool calls of the assistant's answer (an agent's next turn needs them), and counts a
chunk that carries either as output arriving.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from heddle.bench.stream import begin_request, refusal_or_error, spread_times, sse_chunks
from heddle.metrics.record import RequestRecord, TokenTimes
from heddle.workloads import WorkloadRequest


@dataclass(slots=True)
class ChatTurn:
    """What the server answered: text, tool calls (OpenAI's shape), token counts."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None: the server did not say
    finish_reason: str | None = None


@dataclass(slots=True)
class ChatOutcome:
    record: RequestRecord
    turn: ChatTurn
    error: str | None = None
    # HTTP 429, as in heddle.bench.stream.Outcome: a refusal, not an error.
    refused: bool = False
    retry_after: float | None = None
    num_refusals: int = 0


def _merge_tool_call_delta(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """Tool calls stream as pieces keyed by index: the id and name once, arguments in parts."""
    index = int(delta.get("index") or 0)
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


async def send_chat(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    request: WorkloadRequest,
    t0: float,
    timeout: float | None,
    deadline: float | None = None,
) -> ChatOutcome:
    """Send one streaming chat request and time it; never raises for server errors."""
    record, timeout, cut_off = begin_request(request, t0, timeout, deadline)
    turn = ChatTurn()
    chunk_times: list[float] = []
    calls: dict[int, dict[str, Any]] = {}
    texts: list[str] = []
    usage: dict[str, Any] | None = None
    error: str | None = None
    refused = False
    retry_after: float | None = None
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url, json=payload) as response:
                if response.status_code != 200:
                    error, refused, retry_after = await refusal_or_error(response)
                else:
                    async for chunk in sse_chunks(response):
                        now = time.perf_counter() - t0
                        if isinstance(chunk.get("error"), dict):
                            error = f"stream error: {chunk['error'].get('message')}"
                            break
                        usage = chunk.get("usage") or usage
                        for choice in chunk.get("choices") or ():
                            delta = choice.get("delta") or {}
                            carried = False
                            if delta.get("content"):
                                texts.append(delta["content"])
                                carried = True
                            for piece in delta.get("tool_calls") or ():
                                _merge_tool_call_delta(calls, piece)
                                carried = True
                            if carried:
                                chunk_times.append(now)
                            turn.finish_reason = choice.get("finish_reason") or turn.finish_reason
    except TimeoutError:
        error = (
            "cut off at the run's maximum duration" if cut_off else f"timed out after {timeout} s"
        )
    except (httpx.HTTPError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter() - t0
    turn.content = "".join(texts)
    turn.tool_calls = [calls[i] for i in sorted(calls)]
    if error is None and not chunk_times:
        error = "the response carried no text and no tool call"
    record.finish_time = end
    if refused:
        record.finish_reason = "refused"
        return ChatOutcome(record, turn, error, True, retry_after, 1)
    if error is not None:
        record.finish_reason = "abort" if cut_off and error.startswith("cut off") else "error"
        return ChatOutcome(record, turn, error)
    num_tokens = len(chunk_times)
    if usage is not None:
        turn.completion_tokens = int(usage.get("completion_tokens") or num_tokens)
        turn.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            turn.cached_tokens = int(details["cached_tokens"])
        num_tokens = turn.completion_tokens
        record.num_prompt_tokens = int(turn.prompt_tokens or record.num_prompt_tokens)
        record.num_cached_tokens = turn.cached_tokens or 0
    record.token_times = TokenTimes.of(spread_times(chunk_times, num_tokens))
    record.first_token_time = record.token_times[0]
    record.finish_reason = turn.finish_reason or "stop"
    return ChatOutcome(record, turn)
