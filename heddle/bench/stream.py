"""One streaming request to an OpenAI-compatible /v1/completions, timed into a RequestRecord.

Times are seconds since the run's start (`time.perf_counter()` minus `t0`). Each SSE chunk that
carries text marks the arrival of output tokens. When the server reports usage, its
completion_tokens is the token count and the chunk times are spread over that many tokens (a
server may put several tokens in one chunk, or hold text back); otherwise each text chunk counts
as one token.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from heddle.metrics.record import RequestRecord, TokenTimes
from heddle.workloads import WorkloadRequest


@dataclass(slots=True)
class Outcome:
    record: RequestRecord
    error: str | None = None
    # HTTP 429: the server refused the request at arrival (admission control, a full queue).
    # A refusal is not an error: it is load the server chose not to take (heddle.bench.refusals).
    refused: bool = False
    retry_after: float | None = None  # the last refusal's Retry-After, seconds
    num_refusals: int = 0  # 429 answers this request got (several when the client retried)
    first_sent: float | None = None  # the first attempt's time, when it was retried


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header in seconds: delay-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def spread_times(chunk_times: list[float], num_tokens: int) -> list[float]:
    """`num_tokens` token times from the times of the chunks that carried them.

    Keeps the first and last chunk times (so TTFT and E2E stay exact) and interpolates between
    chunks, so the mean time per output token is right even when chunks hold several tokens.
    """
    if num_tokens <= 0 or not chunk_times:
        return []
    if num_tokens == len(chunk_times):
        return list(chunk_times)
    if len(chunk_times) == 1 or num_tokens == 1:
        return [chunk_times[0]] + [chunk_times[-1]] * (num_tokens - 1)
    last = len(chunk_times) - 1
    out = []
    for i in range(num_tokens):
        position = i * last / (num_tokens - 1)
        lo = int(position)
        hi = min(lo + 1, last)
        frac = position - lo
        out.append(chunk_times[lo] + (chunk_times[hi] - chunk_times[lo]) * frac)
    return out


def _error_message(status: int, body: bytes) -> str:
    try:
        data = json.loads(body)
        message = data["error"]["message"] if isinstance(data.get("error"), dict) else data
    except (ValueError, KeyError, TypeError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    return f"HTTP {status}: {message}"


async def refusal_or_error(response: httpx.Response) -> tuple[str, bool, float | None]:
    """A non-200 answer, read: its error message, whether it is a refusal (HTTP 429: load the
    server chose not to take, heddle.bench.refusals) and, for a refusal, its Retry-After in
    seconds. The one reading of a refusal for both stream clients (completions and chat)."""
    message = _error_message(response.status_code, await response.aread())
    if response.status_code == 429:
        return message, True, retry_after_seconds(response.headers.get("retry-after"))
    return message, False, None


async def sse_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI-style server-sent event stream, up to `data: [DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def begin_request(
    request: WorkloadRequest, t0: float, timeout: float | None, deadline: float | None
) -> tuple[RequestRecord, float | None, bool]:
    """A request's record, started now, and the timeout it runs under: the client's, or what
    is left before the run's `deadline` (perf_counter time) if that is shorter, in which case
    the third value says a request still streaming then was cut off by the run's end."""
    cut_off = False
    if deadline is not None:
        left = max(0.0, deadline - time.perf_counter())
        if timeout is None or left < timeout:
            timeout, cut_off = left, True
    record = RequestRecord(
        request_id=request.request_id,
        arrival_time=time.perf_counter() - t0,
        num_prompt_tokens=request.prompt_len,
        request_class=request.request_class,
        user=request.user,
        ttft_slo=request.ttft_slo,
        tpot_slo=request.tpot_slo,
    )
    return record, timeout, cut_off


async def send_request(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    request: WorkloadRequest,
    t0: float,
    timeout: float | None,
    deadline: float | None = None,
) -> Outcome:
    """Send one streaming completion request and time it; never raises for server errors.

    `deadline` (perf_counter time) ends the run: a request still streaming then is cut off and
    counted as aborted.
    """
    record, timeout, cut_off = begin_request(request, t0, timeout, deadline)
    chunk_times: list[float] = []
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
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
                            text = choice.get("text")
                            if text is None:  # a chat chunk
                                text = (choice.get("delta") or {}).get("content")
                            if text:
                                chunk_times.append(now)
                            finish_reason = choice.get("finish_reason") or finish_reason
    except TimeoutError:
        error = (
            "cut off at the run's maximum duration" if cut_off else f"timed out after {timeout} s"
        )
    except (httpx.HTTPError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter() - t0
    if error is None and not chunk_times:
        error = "the response carried no text"
    if refused:
        record.finish_reason = "refused"
        record.finish_time = end
        return Outcome(record, error, refused=True, retry_after=retry_after, num_refusals=1)
    if error is not None:
        record.finish_reason = "abort" if cut_off and error.startswith("cut off") else "error"
        record.finish_time = end
        return Outcome(record, error)
    num_tokens = len(chunk_times)
    if usage is not None:
        num_tokens = int(usage.get("completion_tokens") or num_tokens)
        record.num_prompt_tokens = int(usage.get("prompt_tokens") or record.num_prompt_tokens)
        details = usage.get("prompt_tokens_details") or {}
        record.num_cached_tokens = int(details.get("cached_tokens") or 0)
    record.token_times = TokenTimes.of(spread_times(chunk_times, num_tokens))
    record.first_token_time = record.token_times[0]
    record.finish_time = end
    record.finish_reason = finish_reason or "stop"
    return Outcome(record)
