"""One request of a workload: when it arrives, how long its prompt is, how much it generates."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy

from heddle.errors import HeddleError

# Synthetic prompts draw ids from [DEFAULT_LOW_ID, vocab_size): the low ids of most tokenizers
# are special tokens (BOS, EOS, chat-template markers) that would end or confuse a sequence.
DEFAULT_LOW_ID = 100


def synthetic_prompt_ids(
    prompt_len: int,
    vocab_size: int,
    seed: int | str,
    low: int = DEFAULT_LOW_ID,
    high: int | None = None,
) -> tuple[int, ...]:
    """`prompt_len` token ids drawn uniformly from [low, high) (high defaults to vocab_size).

    The same seed gives the same ids on every run and machine; different seeds give prompts that
    share no prefix beyond chance, so the prefix cache only hits where a workload means it to.
    """
    high = vocab_size if high is None else min(high, vocab_size)
    if prompt_len < 0:
        raise HeddleError(f"prompt_len must be >= 0, got {prompt_len}")
    if not 0 <= low < high:
        raise HeddleError(
            f"cannot draw token ids from [{low}, {high}) with vocab_size {vocab_size}: "
            "pass a smaller `low`"
        )
    if prompt_len == 0:
        return ()
    # What `random.Random(seed).choices(range(low, high), k=prompt_len)` draws, ~1.3x faster:
    # CPython seeds its Mersenne Twister (the string's bytes and their SHA-512, in C) and hands
    # out its next 2 * prompt_len 32-bit words in one `getrandbits` (word i in bits 32i..32i+31);
    # numpy turns each pair into the double `random()` makes of it, (a >> 5) * 2**26 + (b >> 6)
    # over 2**53, and floors it times the range, as `choices` does. The scale is folded into one
    # factor: multiplying by a power of two is exact, so the products round the same.
    generator = _generator()
    generator.seed(seed)
    num_bytes = 8 * prompt_len
    words = numpy.frombuffer(
        generator.getrandbits(8 * num_bytes).to_bytes(num_bytes, "little"), dtype="<u4"
    )
    draws = (words[0::2] >> 5) * 67108864.0
    draws += words[1::2] >> 6
    draws *= (high - low) / 9007199254740992.0
    ids = draws.astype(numpy.int64)
    ids += low
    return tuple(ids.tolist())


def _generator() -> random.Random:
    """This thread's Mersenne Twister (every draw re-seeds it, so no state carries over)."""
    generator = getattr(_THREAD, "generator", None)
    if generator is None:
        generator = _THREAD.generator = random.Random()
    return generator


# Only a cache of the generator object, per thread.
_THREAD = threading.local()


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """A request as a workload describes it; the engine or load client turns it into a real one.

    `output_len` is the true output length: the load client sends max_tokens=output_len with
    ignore_eos, and the simulator emits EOS there. `prompt_token_ids` is set when the ids are
    known (agent calls that extend a previous context, traces that carry ids); otherwise
    `prompt_ids()` synthesizes them from `prompt_seed`.
    """

    request_id: str
    arrival_time: float  # seconds from the start of the run
    prompt_len: int
    output_len: int
    request_class: str = "default"
    user: str | None = None
    priority: int = 0  # lower is more urgent, as in vLLM
    ttft_slo: float | None = None  # seconds
    tpot_slo: float | None = None  # seconds
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_seed: int | str = 0
    # Agent workloads: the program this call belongs to and its position in it. A program is
    # a session: its calls share a growing context. A sub-agent's program names its parent's.
    program_id: str | None = None
    call_index: int = 0
    parent_program_id: str | None = None
    tool: str | None = None  # what runs after this call ends (a tool's name); None: nothing
    expected_pause: float | None = None  # the pause the program expects after this call (s)
    last_call: bool = False  # the program's last call: its session ends with it
    # Shared segments that open the prompt, as (seed, length): the same seed gives the same
    # ids in every request (a system prompt, tool descriptions), so the prefix cache can find
    # them across programs. The rest of the prompt is drawn from `prompt_seed`.
    shared_prefix: tuple[tuple[str, int], ...] = ()
    # Reasoning workloads: output tokens of the thinking phase (closing marker included);
    # the rest of output_len is the answer. 0: no thinking phase.
    thinking_len: int = 0
    # Structured output: the request decodes under a grammar (a JSON object), so each of its
    # sampling steps costs token-mask work (the cost models' per-constrained-row term).
    constrained: bool = False

    def __post_init__(self) -> None:
        # A workload builds these by the hundred thousand: an empty shared prefix (the usual
        # case) skips its checks, which it passes (its sum, 0, fits any prompt_len >= 0).
        shared = self.shared_prefix
        if shared or not isinstance(shared, tuple) or self.prompt_len < 0:
            self._check_shared_prefix()
        if self.expected_pause is not None and not (
            math.isfinite(self.expected_pause) and self.expected_pause >= 0
        ):
            raise HeddleError(f"request {self.request_id}: expected_pause must be >= 0")
        if self.prompt_token_ids is not None:
            if not isinstance(self.prompt_token_ids, tuple):
                object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
            if len(self.prompt_token_ids) != self.prompt_len:
                raise HeddleError(
                    f"request {self.request_id}: prompt_len {self.prompt_len} does not match "
                    f"{len(self.prompt_token_ids)} prompt_token_ids"
                )
        if self.prompt_len < 1:
            raise HeddleError(f"request {self.request_id}: prompt_len must be >= 1")
        if self.output_len < 1:
            raise HeddleError(f"request {self.request_id}: output_len must be >= 1")
        if not (math.isfinite(self.arrival_time) and self.arrival_time >= 0):
            raise HeddleError(
                f"request {self.request_id}: arrival_time must be finite and >= 0, "
                f"got {self.arrival_time}"
            )
        if not 0 <= self.thinking_len < self.output_len:
            raise HeddleError(
                f"request {self.request_id}: thinking_len must be in [0, output_len), "
                f"got {self.thinking_len}"
            )
        if self.ttft_slo is not None and self.ttft_slo <= 0:
            raise HeddleError(f"request {self.request_id}: ttft_slo must be positive")
        if self.tpot_slo is not None and self.tpot_slo <= 0:
            raise HeddleError(f"request {self.request_id}: tpot_slo must be positive")

    def _check_shared_prefix(self) -> None:
        if not isinstance(self.shared_prefix, tuple) or any(
            not isinstance(part, tuple) for part in self.shared_prefix
        ):
            object.__setattr__(
                self, "shared_prefix", tuple((str(s), int(n)) for s, n in self.shared_prefix)
            )
        if sum(n for _, n in self.shared_prefix) > self.prompt_len or any(
            n < 0 for _, n in self.shared_prefix
        ):
            raise HeddleError(
                f"request {self.request_id}: shared prefix {self.shared_prefix} does not fit "
                f"a prompt of {self.prompt_len} tokens"
            )

    def prompt_ids(
        self, vocab_size: int, low: int = DEFAULT_LOW_ID, high: int | None = None
    ) -> tuple[int, ...]:
        """The prompt's token ids: the explicit ones, or ids synthesized from the shared
        prefix's seeds and `prompt_seed`."""
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        ids: tuple[int, ...] = ()
        for seed, length in self.shared_prefix:
            ids += synthetic_prompt_ids(length, vocab_size, seed, low, high)
        rest = self.prompt_len - len(ids)
        return ids + synthetic_prompt_ids(rest, vocab_size, self.prompt_seed, low, high)

    def with_arrival(self, arrival_time: float) -> WorkloadRequest:
        return replace(self, arrival_time=arrival_time)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; fields left at their defaults are omitted to keep traces short."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key in _ALWAYS or value != _DEFAULTS.get(key):
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], default_id: str = "") -> WorkloadRequest:
        """Inverse of `to_dict`; `request_id` may be missing (then `default_id` is used)."""
        unknown = set(data) - set(_FIELDS)
        if unknown:
            raise HeddleError(
                f"unknown request field(s) {sorted(unknown)}; known: {', '.join(_FIELDS)}"
            )
        missing = [k for k in ("arrival_time", "prompt_len", "output_len") if k not in data]
        ids: Sequence[int] | None = data.get("prompt_token_ids")
        if ids is not None and "prompt_len" in missing:
            missing.remove("prompt_len")
        if missing:
            raise HeddleError(f"request {default_id or '?'} lacks field(s) {missing}")
        kwargs = dict(data)
        kwargs.setdefault("request_id", default_id)
        kwargs["request_id"] = str(kwargs["request_id"])
        if ids is not None:
            kwargs["prompt_token_ids"] = tuple(int(i) for i in ids)
            kwargs.setdefault("prompt_len", len(ids))
        kwargs["arrival_time"] = float(kwargs["arrival_time"])
        kwargs["prompt_len"] = int(kwargs["prompt_len"])
        kwargs["output_len"] = int(kwargs["output_len"])
        return cls(**kwargs)


_FIELDS = tuple(WorkloadRequest.__dataclass_fields__)
_ALWAYS = ("request_id", "arrival_time", "prompt_len", "output_len")
_DEFAULTS = {name: f.default for name, f in WorkloadRequest.__dataclass_fields__.items()}
