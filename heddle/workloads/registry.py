"""Workloads by name: `get_workload("chat", rate=4, num_requests=200)` -> `Workload`."""

from __future__ import annotations

import inspect
import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from heddle.errors import HeddleError
from heddle.workloads.agent import AgentProgram
from heddle.workloads.agent_bfcl import bfcl_agent
from heddle.workloads.agent_fanout import fanout_agent
from heddle.workloads.agent_generic import agent
from heddle.workloads.agent_swe import swe_agent
from heddle.workloads.request import DEFAULT_LOW_ID, WorkloadRequest
from heddle.workloads.synthetic import (
    chat,
    long_prompt_mix,
    multi_tenant,
    random_workload,
    reasoning_mix,
)
from heddle.workloads.thinking import thinking_mix
from heddle.workloads.traces import TRACE_FILES, trace

GENERATORS: MappingProxyType[str, Callable[..., Any]] = MappingProxyType(
    {
        "random": random_workload,
        "chat": chat,
        "long-prompt-mix": long_prompt_mix,
        "reasoning-mix": reasoning_mix,
        "thinking-mix": thinking_mix,
        "multi-tenant": multi_tenant,
        "agent": agent,
        "agent-swe": swe_agent,
        "agent-bfcl": bfcl_agent,
        "agent-fanout": fanout_agent,
    }
)
# Options every workload accepts on top of its generator's parameters. `constrained`: the share
# of requests that decode under a grammar (structured outputs), picked by (seed, request id).
COMMON_OPTIONS = ("ttft_slo", "tpot_slo", "constrained")


def list_workloads() -> list[str]:
    """Every name get_workload accepts, besides paths ending in .jsonl or .csv."""
    return [*GENERATORS, *(f"trace:{name}" for name in TRACE_FILES)]


@dataclass(slots=True)
class Workload:
    """The requests of a run and how they were made.

    `requests` are the requests with a known arrival time, sorted by it. For an agent workload
    they are the first call of each program; the driver asks `next_request` for each later call
    when a call finishes.
    """

    name: str
    params: dict[str, Any]
    seed: int
    requests: list[WorkloadRequest]
    programs: list[AgentProgram] = field(default_factory=list)
    _programs_by_id: dict[str, AgentProgram] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._programs_by_id = {p.program_id: p for p in self.programs}

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[WorkloadRequest]:
        return iter(self.requests)

    @property
    def is_agent(self) -> bool:
        return bool(self.programs)

    def describe(self) -> dict[str, Any]:
        """Metadata for reports: name, params (with defaults filled in), seed and counts."""
        flat = self.flat()
        return {
            "name": self.name,
            "params": {k: _json_value(v) for k, v in self.params.items()},
            "seed": self.seed,
            "num_requests": len(flat),
            "num_programs": len(self.programs),
            "num_prompt_tokens": sum(r.prompt_len for r in flat),
            "num_output_tokens": sum(r.output_len for r in flat),
        }

    def next_request(
        self,
        finished: WorkloadRequest,
        finish_time: float,
        *,
        vocab_size: int | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        output_token_ids: Sequence[int] | None = None,
        low: int = DEFAULT_LOW_ID,
        high: int | None = None,
    ) -> WorkloadRequest | None:
        """The request that `finished` causes (an agent's next call), or None.

        See AgentProgram.next_request; requests outside any program cause nothing.
        """
        if finished.program_id is None:
            return None
        program = self._programs_by_id.get(finished.program_id)
        if program is None:
            raise HeddleError(f"no program {finished.program_id!r} in workload {self.name}")
        return program.next_request(
            finished,
            finish_time,
            vocab_size=vocab_size,
            prompt_token_ids=prompt_token_ids,
            output_token_ids=output_token_ids,
            low=low,
            high=high,
        )

    def flat(self) -> list[WorkloadRequest]:
        """Every request including every agent call (planned lengths, zero-time calls), sorted
        by arrival: for reports and token totals."""
        if not self.programs:
            return list(self.requests)
        first = {r.request_id: r for r in self.requests}
        out = []
        for program in self.programs:
            calls = program.flat_requests()
            slo = first.get(calls[0].request_id)
            if slo is not None:  # carry the SLOs set on the first call
                calls = [replace(c, ttft_slo=slo.ttft_slo, tpot_slo=slo.tpot_slo) for c in calls]
            out.extend(calls)
        out.sort(key=lambda r: r.arrival_time)
        return out


def get_workload(name_or_path: str, **kwargs: Any) -> Workload:
    """Build a workload by name (see list_workloads()) or from a .jsonl/.csv trace path.

    Keyword arguments are the generator's parameters (seed, num_requests, rate, arrival, cv,
    length_scale, ...) plus ttft_slo/tpot_slo, which set SLOs on requests that have none, and
    `constrained`, the share of requests (0..1) marked as decoding under a grammar.
    Arguments given as None are left at their defaults.
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    common = {k: kwargs.pop(k) for k in COMMON_OPTIONS if k in kwargs}
    generator: Callable[..., Any]
    if name_or_path in GENERATORS:
        generator = GENERATORS[name_or_path]
        fixed: dict[str, Any] = {}
    elif name_or_path.startswith("trace:"):
        source = name_or_path.removeprefix("trace:")
        if source not in TRACE_FILES:
            raise HeddleError(
                f"unknown trace {name_or_path!r}; known workloads: {', '.join(list_workloads())}"
            )
        generator, fixed = trace, {"source": source}
    elif Path(name_or_path).suffix in (".jsonl", ".csv"):
        generator, fixed = trace, {"source": name_or_path}
    else:
        raise HeddleError(
            f"unknown workload {name_or_path!r}; known: {', '.join(list_workloads())}, "
            "or a path ending in .jsonl or .csv"
        )
    params = _bind(name_or_path, generator, kwargs, fixed)
    made: list[Any] = generator(**fixed, **params)
    params.update(common)
    programs = [p for p in made if isinstance(p, AgentProgram)]
    requests: list[WorkloadRequest] = [p.first_request() for p in programs] if programs else made
    share = common.pop("constrained", None)
    if common:
        requests = [_with_slos(r, common.get("ttft_slo"), common.get("tpot_slo")) for r in requests]
    if share is not None:
        requests = _constrain(name_or_path, requests, share, int(params.get("seed", 0)), programs)
        params["constrained"] = share
    return Workload(name_or_path, params, int(params.get("seed", 0)), requests, programs)


def _bind(
    name: str, generator: Callable[..., Any], kwargs: dict[str, Any], fixed: dict[str, Any]
) -> dict[str, Any]:
    """kwargs with the generator's defaults filled in; unknown names give a clear error."""
    signature = inspect.signature(generator)
    accepted = [p for p in signature.parameters if p not in fixed]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise HeddleError(
            f"workload {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"its parameters: {', '.join([*accepted, *COMMON_OPTIONS])}"
        )
    bound = signature.bind_partial(**fixed, **kwargs)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k not in fixed}


def _constrain(
    name: str,
    requests: list[WorkloadRequest],
    share: Any,
    seed: int,
    programs: list[AgentProgram],
) -> list[WorkloadRequest]:
    """`requests` with a `share` of them (by a hash of seed and request id) constrained."""
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise HeddleError(f"workload option constrained must be a share in [0, 1], got {share!r}")
    if programs:
        raise HeddleError(
            f"workload {name!r} is an agent workload: constrained= marks the requests of "
            "request workloads only (an agent's later calls are made as it runs)"
        )
    threshold = share * 2**32
    return [
        replace(r, constrained=True)
        if zlib.crc32(f"{seed}:{r.request_id}".encode()) < threshold
        else r
        for r in requests
    ]


def _with_slos(r: WorkloadRequest, ttft: float | None, tpot: float | None) -> WorkloadRequest:
    return replace(
        r,
        ttft_slo=r.ttft_slo if r.ttft_slo is not None else ttft,
        tpot_slo=r.tpot_slo if r.tpot_slo is not None else tpot,
    )


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
