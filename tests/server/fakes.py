"""A model-free engine for the server's own unit tests: chars as tokens, a wall-clock executor."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.outputs import ExecutorOutput, SchedulerOutput, TokenLogprobs
from heddle.engine.engine import Engine
from heddle.errors import ModelLoadError
from heddle.request import SamplingParams

EOS = 1
ALPHABET = "abcdefghij "


class CharTokenizer:
    """Token id = code point; a chat template of `role: content` lines."""

    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS or not skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


class CycleExecutor:
    """Emits ALPHABET's letters in turn (by position), after a real sleep of `step_time`."""

    model_name = "fake-model"

    def __init__(self, step_time: float = 0.002, fail_on_token: int | None = None) -> None:
        self.step_time = step_time
        self.fail_on_token = fail_on_token
        self._params: dict[str, SamplingParams] = {}  # per request, from the contract

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        time.sleep(self.step_time)
        so = scheduler_output
        for request_id in (*so.finished_request_ids, *so.preempted_request_ids):
            self._params.pop(request_id, None)
        for new in so.new_requests:
            self._params[new.request_id] = new.sampling_params
        sampled: list[list[int]] = []
        logprobs: dict[str, list[TokenLogprobs]] = {}
        for s in so.rows():
            if not s.sample:
                sampled.append([])
                continue
            token = ord(ALPHABET[s.context_len % len(ALPHABET)])
            if token == self.fail_on_token:
                raise RuntimeError("injected failure")
            sampled.append([token])
            params = self._params[s.request_id]
            if params.logprobs is not None:
                top = [(token, -0.5), (ord("z"), -1.5)][: params.logprobs]
                logprobs[s.request_id] = [TokenLogprobs(token, -0.5, top)]
        return ExecutorOutput(sampled, self.step_time, logprobs)


def make_engine(
    num_blocks: int = 256,
    max_model_len: int = 256,
    step_time: float = 0.002,
    fail_on_token: int | None = None,
    **scheduler: Any,
) -> Engine:
    """Module-level, so that `functools.partial(make_engine, ...)` can start a core process."""
    config = EngineConfig(cache=CacheConfig(block_size=4), scheduler=SchedulerConfig(**scheduler))
    return Engine(
        config,
        CycleExecutor(step_time, fail_on_token),
        num_blocks=num_blocks,
        tokenizer=CharTokenizer(),
        eos_token_id=EOS,
        max_model_len=max_model_len,
        vocab_size=0x110000,
    )


def unloadable_engine() -> Engine:
    """A factory that fails as a bad --model does."""
    raise ModelLoadError("no model at /nowhere")


def slow_engine(pid_file: str, seconds: float = 60.0) -> Engine:
    """A factory that is still loading after `seconds` (a model read from a slow disk): it writes
    the core's pid to `pid_file` first, so a test can find the core while it starts."""
    import os
    import time

    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return make_engine()


def slow_restart_engine(directory: str, seconds: float = 20.0) -> Engine:
    """A factory that starts at once the first time and loads for `seconds` every later time (a
    core restarted from a slow disk): a later core writes its pid to `directory`/restart.pid."""
    import os

    marker = os.path.join(directory, "started")
    if not os.path.exists(marker):
        open(marker, "w").close()
        return make_engine()
    return slow_engine(os.path.join(directory, "restart.pid"), seconds)


def step_counter(engine: Engine):  # -> Callable[[], list[dict]]
    """An event source for a core: one event per step, saying which step it was."""

    last = [0]

    def events() -> list[dict]:
        if engine.num_steps == last[0]:
            return []
        last[0] = engine.num_steps
        return [{"num_steps": engine.num_steps}]

    return events
