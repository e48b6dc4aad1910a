"""POST /v1/completions: a prompt (text or token ids, or a batch of them) in, text out."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from heddle.engine.async_engine import RequestStream
from heddle.engine.outputs import CompletionOutput, RequestOutput
from heddle.errors import InvalidRequestError
from heddle.server.generation import (
    SSE_DONE,
    Prompt,
    follow,
    sse,
    stream_error,
    submit,
)
from heddle.server.render import completion_logprobs, usage
from heddle.server.responses import AbortingStreamingResponse, run_to_completion
from heddle.server.schemas import CompletionRequest
from heddle.server.state import ServerState

MAX_PROMPTS = 64  # prompts in one batched request


async def create_completion(body: CompletionRequest, raw: Request) -> Response:
    state: ServerState = raw.app.state.heddle
    state.check_model(body.model)
    body.check_supported()
    prompts = await _prompts(state, body.prompt)
    params = body.sampling_params(body.max_tokens, body.logprobs)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    hints = body.scheduling_hints(raw.headers)
    if len(prompts) > 1 and hints.get("session_id") is not None:
        raise InvalidRequestError("a session's turn has one prompt", "session_id")
    streams = await submit(state, request_id, prompts, params, hints)
    view = _View(state, body, request_id, len(prompts))
    if body.stream:
        return AbortingStreamingResponse(view.stream(streams), state, streams)
    finals = await run_to_completion(raw, state, streams)
    return JSONResponse(view.response(finals))


async def _prompts(state: ServerState, prompt: str | list[Any]) -> list[Prompt]:
    if isinstance(prompt, str):
        return [Prompt(await state.encode(prompt, add_special_tokens=True), prompt)]
    if not prompt or isinstance(prompt[0], int):
        return [Prompt(list(prompt))]
    if len(prompt) > MAX_PROMPTS:
        raise InvalidRequestError(
            f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}", "prompt"
        )
    if isinstance(prompt[0], str):
        return [Prompt(await state.encode(p, add_special_tokens=True), p) for p in prompt]
    return [Prompt(list(p)) for p in prompt]


class _View:
    """Renders the engine outputs of one request as OpenAI completion objects."""

    def __init__(
        self, state: ServerState, body: CompletionRequest, request_id: str, num_prompts: int
    ) -> None:
        self.state = state
        self.body = body
        self.request_id = request_id
        self.num_prompts = num_prompts
        self.created = int(time.time())

    def _index(self, prompt_index: int, completion: CompletionOutput) -> int:
        return prompt_index * self.body.n + completion.index

    def _object(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
        }

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for p, output in enumerate(finals):
            for c in output.outputs:
                logprobs = None
                if c.logprobs is not None:
                    logprobs = completion_logprobs(self.state, c.logprobs, 0)
                choices.append(
                    {
                        "index": self._index(p, c),
                        "text": c.text,
                        "logprobs": logprobs,
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                    }
                )
        choices.sort(key=lambda c: c["index"])
        return {**self._object(choices), "usage": usage(finals)}

    async def stream(self, streams: list[RequestStream]) -> AsyncIterator[str]:
        include_usage = self.body.include_usage
        finals: list[RequestOutput] = []
        text_offset: dict[int, int] = {}
        done: set[int] = set()
        try:
            async for p, output in follow(self.state, streams):
                for c in output.outputs:
                    index = self._index(p, c)
                    if index in done:
                        continue
                    logprobs = None
                    if c.delta_logprobs is not None:
                        new = c.delta_logprobs
                        if new:
                            offset = text_offset.get(index, 0)
                            logprobs = completion_logprobs(self.state, new, offset)
                    text_offset[index] = text_offset.get(index, 0) + len(c.delta_text)
                    if not c.delta_text and not c.finished and logprobs is None:
                        continue  # text held back (a possible stop string): nothing to say
                    if c.finished:
                        done.add(index)
                    choice = {
                        "index": index,
                        "text": c.delta_text,
                        "logprobs": logprobs,
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                    }
                    chunk = self._object([choice])
                    if include_usage:
                        chunk["usage"] = None
                    yield sse(chunk)
                if output.finished:
                    finals.append(output)
            if include_usage:
                yield sse({**self._object([]), "usage": usage(finals)})
        except Exception as e:
            yield stream_error(e)
        yield SSE_DONE
