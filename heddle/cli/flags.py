"""Flags shared by the subcommands: engine flags made from the config dataclasses, the one
KEY=VALUE parser, and `--slo`.

Every field of `ModelConfig`, `CacheConfig` and `SchedulerConfig` (and `EngineConfig`'s own
scalars, `seed`) is a flag named after it (`max_num_seqs` -> `--max-num-seqs`), its type and
default taken from the field: a field added to a config dataclass is a flag of every command
that runs the engine with no edit here. Help comes from the field's `metadata["help"]`, else
from `HELP` below, else from the field's name.

Flag shapes by field type: `bool` defaulting to True -> `--no-NAME` (`enable_` dropped:
`--no-prefix-caching`), `bool` defaulting to False -> `--NAME`; `int`, `float`, `str` and their
`| None` -> one value; a `Literal` or `Enum` -> its choices; `dict` (`policy_options`) -> a
repeatable `--policy-option KEY=VALUE`; `tuple` / `list` -> repeatable.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import json
import types
import typing
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from heddle.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from heddle.errors import HeddleError

if TYPE_CHECKING:
    from heddle.metrics.summary import SLO

# Help texts of the engine flags (a field's own metadata["help"] wins).
HELP: Mapping[str, str] = {
    "model": "GGUF file or HF model directory (default: embedded SmolLM2-135M-Instruct)",
    "dtype": "auto | bfloat16 | float32 | float16",
    "device": "auto | cpu | cuda[:N]",
    "max_model_len": "context length cap",
    "num_threads": "torch CPU threads",
    "policy": "scheduling policy (see `heddle policies`)",
    "policy_options": "an option of the policy (repeatable; values parsed as JSON or Python "
    "literals)",
    "max_num_seqs": "cap on running requests",
    "max_num_batched_tokens": "token budget of one step",
    "max_waiting": "bound on the waiting queue; beyond it requests are refused (HTTP 429)",
    "long_prefill_token_threshold": "longest prefill chunk of one request in a step",
    "decision_events": "ring buffer of the scheduler's decision events (the dashboard's why); "
    "0: off",
    "admission": "refuse at arrival (HTTP 429 + Retry-After) what is predicted to miss its TTFT "
    "target (slo) or finds its class's queue full (queue); see heddle/core/admission.py",
    "admission_options": "an option of the admission controller (slack, ttft_slo, "
    "window_seconds; queue: max_waiting, a number or a dict by class)",
    "max_recompute_ratio": "preemption guard: tokens preemption may throw away per token "
    "computed over the window, whatever the policy asks ('none': no bound); see "
    "heddle/core/preemption_guard.py",
    "recompute_window_seconds": "the preemption guard's window (seconds, exponentially decayed)",
    "block_size": "tokens per KV block",
    "num_blocks": "KV blocks (default: from --kv-cache-memory-gb)",
    "offload_blocks": "blocks of the second KV tier (host memory beside a GPU pool, a buffer "
    "outside the pool on CPU) where the retention policy may move paused sessions; 0: none",
    "block_hash": "the prefix cache's block hash: sha256 (safe against crafted prompts) or "
    "builtin (Python's tuple hash, cheaper; not collision-resistant)",
    "speculation": "speculative decoding, one KEY=VALUE at a time (repeatable): "
    "method=off|ngram|draft|sim, num_draft_tokens=4, adaptive=true; method=draft: model=PATH "
    "(a draft model sharing the tokenizer); method=sim: acceptance=0.7, acceptance_spread=0.2 "
    "(see SpeculativeConfig)",
}
# Nested config dataclasses given on the command line as repeatable KEY=VALUE items.
KEY_VALUE_CONFIGS: tuple[type, ...] = (SpeculativeConfig,)
MODEL_GROUP = "model"
SCHEDULER_GROUP = "scheduler and KV cache"


# -- KEY=VALUE ------------------------------------------------------------------------------
def parse_value(raw: str) -> Any:
    """A flag's value: JSON (`null`, `true`, `[1, 2]`, `{"a": 1}`), else a Python literal
    (`None`, `{'short': 1.0}`), else the string itself."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw


def parse_key_values(items: Iterable[str], option: str = "--option") -> dict[str, Any]:
    """["aging_seconds=0.5", "ttft={'short': 1.0}", "long-share=0.2", "mode=x"] -> typed values
    (see `parse_value`); dashes in keys become underscores. Raises HeddleError naming `option`
    for an item without KEY=."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise HeddleError(f"{option} wants KEY=VALUE, got {item!r}")
        out[key.replace("-", "_")] = parse_value(raw)
    return out


def key_value_flag(field_name: str) -> str:
    """`policy_options` -> `--policy-option`: a dict field is given one KEY=VALUE at a time."""
    return "--" + field_name.removesuffix("s").replace("_", "-")


def parse_slo(text: str | None) -> SLO | None:
    """ "ttft=0.5,tpot=0.05" (seconds; "ms" suffix allowed) -> SLO (`--slo` of bench and
    simulate)."""
    from heddle.metrics.summary import SLO

    if not text:
        return None
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.strip().partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot"):
            raise HeddleError(f"--slo wants ttft=SECONDS,tpot=SECONDS, got {text!r}")
        raw = raw.strip().lower()
        scale = 1e-3 if raw.endswith("ms") else 1.0
        try:
            values[key] = float(raw.removesuffix("ms").removesuffix("s")) * scale
        except ValueError:
            raise HeddleError(f"--slo: {raw!r} is not a number of seconds") from None
    try:
        return SLO(**values)
    except ValueError as e:
        raise HeddleError(f"--slo: {e}") from None


# -- flags from config dataclasses ----------------------------------------------------------
def _unwrap_optional(tp: Any) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def _flag_kwargs(f: dataclasses.Field[Any], tp: Any, default: Any) -> tuple[str, dict[str, Any]]:
    """The flag name and add_argument keywords of one config field."""
    name = f.name
    base = _unwrap_optional(tp)
    origin = typing.get_origin(base)
    if base is bool:
        if default is True:
            return "--no-" + name.removeprefix("enable_").replace("_", "-"), {
                "action": "store_false"
            }
        return "--" + name.replace("_", "-"), {"action": "store_true"}
    if base is dict or origin is dict:
        return key_value_flag(name), {"action": "append", "metavar": "KEY=VALUE", "default": []}
    if base in KEY_VALUE_CONFIGS:
        return "--" + name.replace("_", "-"), {
            "action": "append", "metavar": "KEY=VALUE", "default": []
        }
    if origin in (tuple, list) or base in (tuple, list):
        args = [a for a in typing.get_args(base) if a is not Ellipsis]
        item = args[0] if args and args[0] in (int, float, str) else str
        return "--" + name.replace("_", "-").removesuffix("s"), {
            "action": "append",
            "type": item,
            "default": None,
        }
    flag = "--" + name.replace("_", "-")
    if origin is typing.Literal:
        choices = typing.get_args(base)
        return flag, {"choices": choices, "type": type(choices[0])}
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return flag, {"choices": [m.value for m in base], "type": type(next(iter(base)).value)}
    if base in (int, float) and base is not tp:
        return flag, {"type": _optional_number(base)}  # `| None`: 'none' gives None
    if base in (int, float, str):
        return flag, {"type": base}
    raise TypeError(
        f"config field {name!r} of type {tp!r} has no command-line form: give it one in "
        "heddle/cli/flags.py"
    )


def _optional_number(base: type) -> Any:
    def parse(text: str) -> Any:
        return None if text.strip().lower() == "none" else base(text)

    parse.__name__ = base.__name__  # argparse names the type in its error message
    return parse


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def config_fields(config_cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """(field, resolved type) of a config dataclass, nested config dataclasses left out."""
    hints = typing.get_type_hints(config_cls)
    return [
        (f, hints[f.name])
        for f in dataclasses.fields(config_cls)
        if not dataclasses.is_dataclass(hints[f.name]) or hints[f.name] in KEY_VALUE_CONFIGS
    ]


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config_cls: type,
    *,
    defaults: Mapping[str, Any] | None = None,
    helps: Mapping[str, str] | None = None,
    exclude: Collection[str] = (),
) -> None:
    """One flag per field of `config_cls` (see the module doc). `defaults` and `helps` override
    a field's default and help for this command; `exclude` leaves fields out."""
    defaults, helps = defaults or {}, helps or {}
    for f, tp in config_fields(config_cls):
        if f.name in exclude:
            continue
        default = defaults.get(f.name, _default_of(f))
        flag, kwargs = _flag_kwargs(f, tp, default)
        kwargs.setdefault("default", default)
        kwargs["dest"] = f.name
        text = helps.get(f.name) or f.metadata.get("help") or HELP.get(f.name)
        if text is not None:
            kwargs["help"] = text
        parser.add_argument(flag, **kwargs)


def config_from_args(config_cls: type, args: argparse.Namespace) -> Any:
    """`config_cls` from the flags `add_config_arguments` made; fields without a flag (excluded)
    keep their defaults. Raises HeddleError for bad values (the dataclass validates them)."""
    hints = dict(config_fields(config_cls))
    values: dict[str, Any] = {}
    for f, tp in hints.items():
        if not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        base = _unwrap_optional(tp)
        if base is dict or typing.get_origin(base) is dict:
            value = parse_key_values(value or [], key_value_flag(f.name))
        elif base in KEY_VALUE_CONFIGS:
            flag = "--" + f.name.replace("_", "-")
            items = parse_key_values(value or [], flag) if isinstance(value, list) else None
            if items is not None:
                try:
                    value = base(**items)
                except TypeError as e:
                    raise HeddleError(f"{flag}: {e}") from None
        elif value is not None and (typing.get_origin(base) is tuple or base is tuple):
            value = tuple(value)
        elif value is None and _default_of(f) is not None:
            continue  # a repeatable flag never given: the field's default
        values[f.name] = value
    return config_cls(**values)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of every command that runs the real engine: one per config field."""
    model = parser.add_argument_group(MODEL_GROUP)
    add_config_arguments(model, ModelConfig)
    add_config_arguments(model, EngineConfig)  # seed
    scheduler = parser.add_argument_group(SCHEDULER_GROUP)
    add_config_arguments(scheduler, SchedulerConfig)
    add_config_arguments(scheduler, CacheConfig)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags of `add_engine_arguments` describe."""
    engine_fields = {f.name for f, _ in config_fields(EngineConfig)}
    scalars = {k: getattr(args, k) for k in engine_fields if hasattr(args, k)}
    return EngineConfig(
        model=config_from_args(ModelConfig, args),
        cache=config_from_args(CacheConfig, args),
        scheduler=config_from_args(SchedulerConfig, args),
        **scalars,
    )
