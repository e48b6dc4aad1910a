"""Request bodies of the OpenAI API (pydantic), with heddle's extensions.

Unknown fields are ignored, as vLLM and llama.cpp do; fields heddle knows but cannot honour
(penalties, logit_bias, echo, images) are rejected with a 400 rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from heddle.errors import InvalidRequestError
from heddle.request import SamplingParams
from heddle.sessions.session import MAX_SESSION_ID_LEN

MAX_N = 16  # completions per request
MAX_LOGPROBS = 20  # top alternatives per token, OpenAI's limit
MAX_STOP = 16  # stop strings per request
SESSION_HEADER = "x-session-id"  # the session id as a header (HTTP headers ignore case)
MAX_TOOLS = 128  # OpenAI's limit

NonNegInt = Annotated[int, Field(ge=0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _CommonRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # 0 or -1: disabled
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: list[NonNegInt] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # heddle extensions: scheduling hints read by the policies.
    priority: int = 0  # lower is more urgent
    request_class: str | None = Field(None, max_length=64)
    ttft_slo: float | None = Field(None, gt=0.0)  # seconds
    tpot_slo: float | None = Field(None, gt=0.0)  # seconds
    # heddle extensions: the agent session this request is a turn of (heddle/sessions). The
    # session id may also come as the `X-Session-Id` header.
    session_id: str | None = Field(None, min_length=1, max_length=MAX_SESSION_ID_LEN)
    parent_session_id: str | None = Field(None, min_length=1, max_length=MAX_SESSION_ID_LEN)
    expected_pause: float | None = Field(None, ge=0.0)  # seconds until the next turn
    close_session: bool = False  # the session's last turn: nothing stays parked after it
    # seconds the whole program may take from this turn (its later turns inherit it: slo)
    program_deadline: float | None = Field(None, gt=0.0)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_supported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise InvalidRequestError(f"{name} is not supported by heddle; use 0", name)
        if self.logit_bias:
            raise InvalidRequestError("logit_bias is not supported by heddle", "logit_bias")

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        stop: tuple[str, ...]
        if self.stop is None:
            stop = ()
        elif isinstance(self.stop, str):
            stop = (self.stop,)
        else:
            stop = tuple(self.stop)
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(0, self.top_k or 0),
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=stop,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
        )

    def scheduling_hints(self, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Engine.add_request's keyword arguments for the policies (and the session)."""
        hints: dict[str, Any] = {
            "priority": self.priority,
            "user": self.user,
            "request_class": self.request_class or "default",
            "ttft_slo": self.ttft_slo,
            "tpot_slo": self.tpot_slo,
        }
        session_id = self.session_id
        header = headers.get(SESSION_HEADER) if headers is not None else None
        if header is not None:
            if session_id is not None and header != session_id:
                raise InvalidRequestError(
                    f"the {SESSION_HEADER} header and session_id name different sessions",
                    "session_id",
                )
            if not 0 < len(header) <= MAX_SESSION_ID_LEN:
                raise InvalidRequestError(
                    f"the {SESSION_HEADER} header must be 1-{MAX_SESSION_ID_LEN} characters",
                    "session_id",
                )
            session_id = header
        if (
            session_id is not None
            or self.parent_session_id is not None
            or self.expected_pause is not None
            or self.close_session
            or self.program_deadline is not None
        ):
            hints.update(
                session_id=session_id,
                parent_session_id=self.parent_session_id,
                expected_pause=self.expected_pause,
                close_session=self.close_session,
                program_deadline=self.program_deadline,
            )
        return hints


class CompletionRequest(_CommonRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise InvalidRequestError("echo is not supported by heddle", "echo")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported by heddle", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidRequestError("best_of other than n is not supported", "best_of")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_calls, tool_call_id, ... reach the template

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def for_template(self, index: int) -> dict[str, Any]:
        """The message as a chat template reads it: content as one string."""
        message = self.model_dump(exclude_none=True)
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(
                        f"content part of type {part.type!r} is not supported: text only",
                        f"messages.{index}.content",
                    )
                texts.append(part.text)
            message["content"] = "\n".join(texts)
        elif content is None:
            message["content"] = ""
        return message


FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field("response", max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class ChatCompletionRequest(_CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    # Reasoning models: extra template variables (e.g. enable_thinking) and thinking budgets.
    chat_template_kwargs: dict[str, Any] | None = None
    max_thinking_tokens: int | None = Field(None, ge=0)
    reasoning_effort: str | None = None  # none | low | medium | high

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template and the tool-call formats read them."""
        if not self.tools:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    @property
    def tool_choice_value(self) -> str | dict[str, Any]:
        """OpenAI's default: "auto" with tools, "none" without."""
        choice = self.tool_choice
        if choice is None:
            return "auto" if self.tools else "none"
        return choice if isinstance(choice, str) else choice.model_dump()

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the output is read for tool calls (tools given, and not tool_choice none)."""
        return bool(self.tools) and self.tool_choice_value != "none"

    def response_format_dict(self) -> dict[str, Any] | None:
        if self.response_format is None:
            return None
        return self.response_format.model_dump(by_alias=True, exclude_none=True)

    @property
    def max_output_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise InvalidRequestError("top_logprobs needs logprobs=true", "top_logprobs")
            return None
        return self.top_logprobs or 0

    def check_supported(self) -> None:
        super().check_supported()
        choice = self.tool_choice_value
        if choice not in ("none", "auto") and not self.tools:
            raise InvalidRequestError(
                "tool_choice other than none or auto needs tools", "tool_choice"
            )
        if self.tools:
            names = [t.function.name for t in self.tools]
            if len(set(names)) != len(names):
                raise InvalidRequestError("tool names must be unique", "tools")
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is None:
            raise InvalidRequestError(
                "response_format json_schema needs its json_schema object", "response_format"
            )
