"""POST /v1/chat/completions: messages rendered by the model's chat template, text out.

With `tools`, the model's text is parsed for tool calls in the model family's format
(`heddle.tools`): calls go to `message.tool_calls` (streamed as `delta.tool_calls`), the rest
stays content. `tool_choice` required / named and `response_format` JSON are enforced by a
grammar the engine applies to the sampled tokens (`heddle.structured`). For a reasoning model
(Qwen3-style `<think>`), the reasoning is split off first and tool calls are read from the
content after it, whole and streamed.

A reply cut by `max_tokens` in the middle of a call keeps `finish_reason: "length"` (only a
reply that stopped by itself becomes "tool_calls"), and the call is returned with the
arguments written so far, as the OpenAI API does: a client sees from the finish reason that
the last call is incomplete (its arguments do not parse), streamed or not.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from heddle.engine.async_engine import RequestStream
from heddle.engine.outputs import CompletionOutput, RequestOutput
from heddle.reasoning import thinking_budget
from heddle.server.generation import SSE_DONE, Prompt, follow, sse, stream_error, submit
from heddle.server.reasoning import ReasoningView, reasoning_format_of
from heddle.server.render import chat_logprobs, usage
from heddle.server.responses import AbortingStreamingResponse, run_to_completion
from heddle.server.schemas import ChatCompletionRequest
from heddle.server.state import ServerState
from heddle.tools import ToolCallFormat, ToolCallStream, resolve_format, template_renders_tools
from heddle.tools.choice import choose_grammar
from heddle.tools.messages import prepare_messages


async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    state: ServerState = raw.app.state.heddle
    state.check_model(body.model)
    body.check_supported()
    fmt = _tool_format(state, body)
    prompt = await _prompt(state, body, fmt)
    grammar = choose_grammar(
        fmt,
        body.tool_dicts(),
        body.tool_choice_value,
        body.parallel_tool_calls,
        body.response_format_dict(),
    )
    params = body.sampling_params(body.max_output_tokens, body.num_logprobs)
    budget = thinking_budget(body.max_thinking_tokens, body.reasoning_effort, params.max_tokens)
    reasoning = None
    rfmt = reasoning_format_of(state.tokenizer)
    if rfmt is not None:
        params = replace(params, max_thinking_tokens=budget)
        ids, starts_in_thinking = rfmt.prepare_prompt(prompt.token_ids, budget)
        prompt = Prompt(ids, prompt.text)
        reasoning = ReasoningView(rfmt.parser(), starts_in_thinking)
    hints = body.scheduling_hints(raw.headers)
    if grammar is not None:
        hints["grammar"] = grammar
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    streams = await submit(state, request_id, [prompt], params, hints)
    view = _View(state, body, request_id, fmt if body.parses_tool_calls else None, reasoning)
    if body.stream:
        return AbortingStreamingResponse(view.stream(streams[0]), state, streams)
    finals = await run_to_completion(raw, state, streams)
    return JSONResponse(view.response(finals[0]))


def _template(state: ServerState) -> str | None:
    return getattr(state.tokenizer, "chat_template", None)


def _tool_format(state: ServerState, body: ChatCompletionRequest) -> ToolCallFormat | None:
    """The tool-call format, when the request or its history involves tools."""
    history = any(m.role == "tool" or getattr(m, "tool_calls", None) for m in body.messages)
    if not body.tools and not history:
        return None
    name = getattr(state, "tool_call_parser", "auto")
    return resolve_format(name, _template(state))


async def _prompt(state: ServerState, body: ChatCompletionRequest, fmt: ToolCallFormat | None
                  ) -> Prompt:
    messages = [m.for_template(i) for i, m in enumerate(body.messages)]
    kwargs: dict[str, Any] = {
        **(body.chat_template_kwargs or {}),
        "add_generation_prompt": body.add_generation_prompt,
    }
    if fmt is not None:
        native = template_renders_tools(_template(state))
        messages, extra = prepare_messages(messages, body.tool_dicts(), fmt, native)
        kwargs.update(extra)
    text = await state.render_chat(messages, **kwargs)
    # The template writes the special tokens (BOS, role markers) itself.
    return Prompt(await state.encode(text, add_special_tokens=False), text)


def _finish_reason(completion: CompletionOutput, has_calls: bool) -> str | None:
    if has_calls and completion.finish_reason == "stop":
        return "tool_calls"
    return completion.finish_reason


class _View:
    """Renders the engine outputs of one request as OpenAI chat completion objects."""

    def __init__(
        self,
        state: ServerState,
        body: ChatCompletionRequest,
        request_id: str,
        fmt: ToolCallFormat | None,
        reasoning: ReasoningView | None = None,
    ) -> None:
        self.state = state
        self.body = body
        self.request_id = request_id
        self.fmt = fmt  # None: the text is not read for tool calls
        self.reasoning = reasoning  # None: the text is all content (or tool calls)
        self.created = int(time.time())


    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": kind,
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
        }

    def _message(self, completion: CompletionOutput) -> tuple[dict[str, Any], bool]:
        if self.fmt is None:
            if self.reasoning is not None:
                return {"role": "assistant", **self.reasoning.message(completion.text)}, False
            return {"role": "assistant", "content": completion.text}, False
        text = completion.text
        message: dict[str, Any] = {"role": "assistant"}
        if self.reasoning is not None:  # reasoning first; calls are read from the content
            message.update(self.reasoning.message(text))
            text = message.get("content") or ""
        parsed = self.fmt.parse(text)
        message["content"] = parsed.content
        if parsed.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in parsed.tool_calls]
        return message, bool(parsed.tool_calls)

    def response(self, final: RequestOutput) -> dict[str, Any]:
        choices = []
        for c in final.outputs:
            message, has_calls = self._message(c)
            choices.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": chat_logprobs(self.state, c.logprobs)
                    if c.logprobs is not None
                    else None,
                    "finish_reason": _finish_reason(c, has_calls),
                    "stop_reason": c.stop_reason,
                }
            )
        return {**self._object("chat.completion", choices), "usage": usage([final])}

    def _chunk(self, choice: dict[str, Any]) -> str:
        chunk = self._object("chat.completion.chunk", [choice])
        if self.body.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    def _delta(
        self, parsers: dict[int, ToolCallStream], completion: CompletionOutput
    ) -> dict[str, Any]:
        """The delta of one output: its new text, or (when reading tool calls) the content
        and call pieces that the new text completes."""
        if self.fmt is None:
            if self.reasoning is not None:
                return self.reasoning.delta(
                    completion.index, completion.delta_text, completion.finished
                )
            return {"content": completion.delta_text} if completion.delta_text else {}
        parser = parsers.get(completion.index)
        if parser is None:
            parser = parsers[completion.index] = self.fmt.stream()
        text = completion.delta_text
        delta: dict[str, Any] = {}
        if self.reasoning is not None:  # reasoning first; calls are read from the content
            delta = self.reasoning.delta(completion.index, text, completion.finished)
            text = delta.pop("content", "")
        parsed = parser.feed(text)
        if completion.finished:
            parsed.extend(parser.finish())
        if parsed.content:
            delta["content"] = parsed.content
        if parsed.tool_calls:
            delta["tool_calls"] = [d.to_openai() for d in parsed.tool_calls]
        return delta

    async def stream(self, stream: RequestStream) -> AsyncIterator[str]:
        final: RequestOutput | None = None
        done: set[int] = set()
        parsers: dict[int, ToolCallStream] = {}
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
                    delta = self._delta(parsers, c)
                    if not delta and not c.finished and logprobs is None:
                        continue
                    if c.finished:
                        done.add(c.index)
                    has_calls = c.index in parsers and bool(parsers[c.index].calls)
                    choice = {
                        "index": c.index,
                        "delta": delta,
                        "logprobs": logprobs,
                        "finish_reason": _finish_reason(c, has_calls) if c.finished else None,
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
