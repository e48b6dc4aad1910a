"""POST /v1/chat/completions: messages rendered by the model's chat template, text out."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from heddle.engine.async_engine import RequestStream
from heddle.engine.outputs import RequestOutput
from heddle.reasoning import thinking_budget
from heddle.server.generation import SSE_DONE, Prompt, follow, sse, stream_error, submit
from heddle.server.reasoning import ReasoningView, reasoning_format_of
from heddle.server.render import chat_logprobs, usage
from heddle.server.responses import AbortingStreamingResponse, run_to_completion
from heddle.server.schemas import ChatCompletionRequest
from heddle.server.state import ServerState


async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    state: ServerState = raw.app.state.heddle
    state.check_model(body.model)
    body.check_supported()
    prompt = await _prompt(state, body)
    params = body.sampling_params(body.max_output_tokens, body.num_logprobs)
    budget = thinking_budget(body.max_thinking_tokens, body.reasoning_effort, params.max_tokens)
    reasoning = None
    fmt = reasoning_format_of(state.tokenizer)
    if fmt is not None:
        params = replace(params, max_thinking_tokens=budget)
        ids, starts_in_thinking = fmt.prepare_prompt(prompt.token_ids, budget)
        prompt = Prompt(ids, prompt.text)
        reasoning = ReasoningView(fmt.parser(), starts_in_thinking)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    hints = body.scheduling_hints(raw.headers)
    streams = await submit(state, request_id, [prompt], params, hints)
    view = _View(state, body, request_id, reasoning)
    if body.stream:
        return AbortingStreamingResponse(view.stream(streams[0]), state, streams)
    finals = await run_to_completion(raw, state, streams)
    return JSONResponse(view.response(finals[0]))


async def _prompt(state: ServerState, body: ChatCompletionRequest) -> Prompt:
    messages = [m.for_template(i) for i, m in enumerate(body.messages)]
    kwargs: dict[str, Any] = {
        **(body.chat_template_kwargs or {}),
        "add_generation_prompt": body.add_generation_prompt,
    }
    if body.tools:
        kwargs["tools"] = body.tools
    text = await state.render_chat(messages, **kwargs)
    # The template writes the special tokens (BOS, role markers) itself.
    return Prompt(await state.encode(text, add_special_tokens=False), text)


class _View:
    """Renders the engine outputs of one request as OpenAI chat completion objects."""

    def __init__(
        self,
        state: ServerState,
        body: ChatCompletionRequest,
        request_id: str,
        reasoning: ReasoningView | None = None,
    ) -> None:
        self.state = state
        self.body = body
        self.request_id = request_id
        self.reasoning = reasoning  # None: the text is all content
        self.created = int(time.time())

    def _message(self, text: str) -> dict[str, Any]:
        if self.reasoning is None:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", **self.reasoning.message(text)}

    def _delta(self, index: int, delta_text: str, finished: bool) -> dict[str, Any]:
        if self.reasoning is None:
            return {"content": delta_text} if delta_text else {}
        return self.reasoning.delta(index, delta_text, finished)

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": kind,
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
        }

    def response(self, final: RequestOutput) -> dict[str, Any]:
        choices = [
            {
                "index": c.index,
                "message": self._message(c.text),
                "logprobs": chat_logprobs(self.state, c.logprobs)
                if c.logprobs is not None
                else None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in final.outputs
        ]
        return {**self._object("chat.completion", choices), "usage": usage([final])}

    def _chunk(self, choice: dict[str, Any]) -> str:
        chunk = self._object("chat.completion.chunk", [choice])
        if self.body.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    async def stream(self, stream: RequestStream) -> AsyncIterator[str]:
        final: RequestOutput | None = None
        done: set[int] = set()
        try:
            for index in range(self.body.n):
                delta = {"role": "assistant", "content": ""}
                yield self._chunk(
                    {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
                )
            async for _, output in follow(self.state, [stream]):
                for c in output.outputs:
                    if c.index in done:
                        continue
                    logprobs = None
                    if c.delta_logprobs is not None:
                        new = c.delta_logprobs
                        if new:
                            logprobs = chat_logprobs(self.state, new)
                    delta = self._delta(c.index, c.delta_text, c.finished)
                    if not delta and not c.finished and logprobs is None:
                        continue
                    if c.finished:
                        done.add(c.index)
                    choice = {
                        "index": c.index,
                        "delta": delta,
                        "logprobs": logprobs,
                        "finish_reason": c.finish_reason,
                    }
                    if c.finished:
                        choice["stop_reason"] = c.stop_reason
                    yield self._chunk(choice)
                if output.finished:
                    final = output
            if self.body.include_usage and final is not None:
                yield sse({**self._object("chat.completion.chunk", []), "usage": usage([final])})
        except Exception as e:
            yield stream_error(e)
        yield SSE_DONE
