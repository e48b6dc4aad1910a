"""What crosses between the front end and an engine core process, and how it is encoded.

Front end -> core: commands (`Add`, `Abort`, `Stop`, `Shutdown`), a few per request, pickled (so
that whatever a `SamplingParams` grows crosses unchanged). Core -> front end: one `StepBatch`
per step, MessagePack through msgspec with a fixed schema (measured against pickle in
benchmarks/serving_path.py --codec): the new token ids of every request that got some, the
answers to the commands applied before the step, the engine's stats, and the records, step
stats and per-step events that feed /metrics and the live view.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import msgspec

from heddle.core.outputs import TokenLogprobs
from heddle.metrics.record import RequestRecord, TokenTimes
from heddle.metrics.steps import StepStat
from heddle.request import SamplingParams

# -- front end -> core --------------------------------------------------------------------------


@dataclass(slots=True)
class Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    kwargs: dict[str, Any]  # Engine.add_request's keyword arguments (priority, user, ...)


@dataclass(slots=True)
class Abort:
    request_id: str | None  # None: every request in the core


@dataclass(slots=True)
class Stop:
    """The front end found stop string `stop` in sequence `index`: end it in the core."""

    request_id: str
    index: int
    stop: str


@dataclass(slots=True)
class Shutdown:
    """Abort everything in flight, answer with a last batch, and exit."""


@dataclass(slots=True)
class CloseSession:
    """Close an agent session: free its parked KV (heddle/sessions)."""

    session_id: str


Command = Add | Abort | Stop | Shutdown | CloseSession


def encode_commands(commands: list[Command]) -> bytes:
    return pickle.dumps(commands, protocol=pickle.HIGHEST_PROTOCOL)


def decode_commands(data: bytes) -> list[Command]:
    commands = pickle.loads(data)
    if not isinstance(commands, list):
        raise TypeError(f"expected a list of commands, got {type(commands).__name__}")
    return commands


# -- core -> front end --------------------------------------------------------------------------


class Delta(msgspec.Struct, array_like=True, gc=False):
    """What sequence `index` of a request got in one step."""

    request_id: str
    index: int
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None
    num_cached_tokens: int = 0


class Rejected(msgspec.Struct, array_like=True, gc=False):
    """An Add the core refused: `kind` names the error class the front end raises."""

    request_id: str
    kind: str  # "invalid" | "queue_full" | "other"
    message: str
    param: str | None = None
    # queue_full: seconds after which a retry may be admitted, why, and the request's class.
    retry_after: float | None = None
    reason: str | None = None
    request_class: str | None = None


class Stats(msgspec.Struct, array_like=True, gc=False):
    num_running: int = 0
    num_waiting: int = 0
    num_preempted: int = 0
    num_preemptions_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    prefix_cache_hit_rate: float = 0.0
    num_steps: int = 0


class StepBatch(msgspec.Struct, array_like=True):
    """Everything one pass of the core loop has to say."""

    deltas: list[Delta] = []
    accepted: list[str] = []
    rejected: list[Rejected] = []
    # A step raised: these requests failed (and were dropped in the core) with this message.
    failed_ids: list[str] = []
    failure: str | None = None
    stats: Stats | None = None
    records: list[RequestRecord] = []
    steps: list[StepStat] = []
    # Per-step data for whoever listens (the live view's decision events); any msgpack value.
    events: list[Any] = []
    final: bool = False  # the core is exiting after this batch


class Ready(msgspec.Struct):
    """The core's first message: what the front end needs to know about the engine."""

    pid: int
    model_name: str
    max_model_len: int | None
    vocab_size: int | None
    eos_token_id: int | None
    num_blocks: int
    block_size: int
    max_waiting: int | None
    tokenizer: bytes  # the pickled tokenizer (the front end detokenizes)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, TokenTimes):  # a record's token times travel as a list of floats
        return list(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is TokenTimes:
        return TokenTimes.of(obj)
    raise NotImplementedError(f"cannot decode {kind.__name__}")


_batch_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_batch_decoder = msgspec.msgpack.Decoder(StepBatch, dec_hook=_dec_hook)
_ready_decoder = msgspec.msgpack.Decoder(Ready)


def encode_batch(batch: StepBatch) -> bytes:
    return _batch_encoder.encode(batch)


def decode_batch(data: bytes) -> StepBatch:
    return _batch_decoder.decode(data)


def encode_ready(ready: Ready) -> bytes:
    return _batch_encoder.encode(ready)


def decode_ready(data: bytes) -> Ready:
    return _ready_decoder.decode(data)
