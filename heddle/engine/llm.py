"""The offline API, shaped like vLLM's: `LLM(...).generate(prompts, params)` and `.chat(...)`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.engine.outputs import RequestOutput
from heddle.request import SamplingParams

PromptInput = str | list[int]
Message = dict[str, str]

# Keyword arguments of LLM(...) are the config fields (a field added to a config is one more).
_MODEL_FIELDS = tuple(f.name for f in fields(ModelConfig) if f.name != "model")
_CACHE_FIELDS = tuple(f.name for f in fields(CacheConfig))
_SCHEDULER_FIELDS = tuple(f.name for f in fields(SchedulerConfig))


def build_config(model: str | None = None, seed: int = 0, **kwargs: Any) -> EngineConfig:
    """An EngineConfig from flat keyword arguments; unknown names are an error."""
    known = set(_MODEL_FIELDS) | set(_CACHE_FIELDS) | set(_SCHEDULER_FIELDS)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"unknown engine arguments: {', '.join(unknown)}")

    def pick(names: tuple[str, ...]) -> dict[str, Any]:
        return {k: kwargs[k] for k in names if k in kwargs and kwargs[k] is not None}

    return EngineConfig(
        model=ModelConfig(model=model, **pick(_MODEL_FIELDS)),
        cache=CacheConfig(**pick(_CACHE_FIELDS)),
        scheduler=SchedulerConfig(**pick(_SCHEDULER_FIELDS)),
        seed=seed,
    )


class LLM:
    """Load a model and generate from batches of prompts with continuous batching.

    `LLM()` loads the embedded SmolLM2-135M-Instruct; `LLM(model=PATH, dtype=..., policy=...)`
    loads a GGUF file or a Hugging Face model directory.
    """

    def __init__(self, model: str | None = None, *, seed: int = 0, **kwargs: Any) -> None:
        self.config = build_config(model, seed=seed, **kwargs)
        self.engine = Engine.from_config(self.config)
        self._counter = itertools.count()

    @classmethod
    def from_engine(cls, engine: Engine) -> LLM:
        """The offline API over an engine built by hand (e.g. sharing a loaded executor)."""
        llm = cls.__new__(cls)
        llm.config = engine.config
        llm.engine = engine
        llm._counter = itertools.count()
        return llm

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in the order of the prompts."""
        batch = _as_batch(prompts)
        params = _as_params(sampling_params, len(batch))
        ids = []
        for prompt, p in zip(batch, params, strict=True):
            request_id = str(next(self._counter))
            if isinstance(prompt, str):
                token_ids = self.tokenizer.encode(prompt)
                self.engine.add_request(request_id, token_ids, p, prompt=prompt)
            else:
                self.engine.add_request(request_id, list(prompt), p)
            ids.append(request_id)
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Render conversations with the model's chat template and generate replies."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.apply_chat_template(list(c), add_generation_prompt=True)
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        wanted = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        advance: Callable[[int], None] = lambda _: None  # noqa: E731
        progress = None
        if use_tqdm:
            from rich.progress import Progress

            progress = Progress()
            task = progress.add_task("generating", total=len(request_ids))
            progress.start()
            advance = lambda n: progress.update(task, advance=n)  # noqa: E731
        try:
            idle_steps = 0
            while wanted - finished.keys():
                outputs = self.engine.step()
                idle_steps = 0 if outputs else idle_steps + 1
                if idle_steps > 10_000:
                    raise RuntimeError("the scheduler made no progress for 10,000 steps")
                done = [o for o in outputs if o.finished and o.request_id in wanted]
                for output in done:
                    finished[output.request_id] = output
                advance(len(done))
        finally:
            if progress is not None:
                progress.stop()
        return [finished[i] for i in request_ids]


def _as_batch(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [list(items)]  # type: ignore[arg-type]
    return items  # type: ignore[return-value]


def _as_params(
    params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ValueError(f"{len(params)} sampling params for {count} prompts")
    return params
