"""Refusals in a bench run: what the server would not take (HTTP 429), kept apart from errors.

A server with admission control (heddle's `--admission slo|queue`, vLLM's and SGLang's queue
bounds) answers HTTP 429 with a `Retry-After` when it chooses not to queue a request. That is
load shed on purpose, not a failure: the report counts it per class, says whether the client
honoured `Retry-After` (sent the request again after it, `--retry-refused N`) and what came of
the retries, and counts goodput with every request that was offered in the denominator, so a
server cannot look good by refusing most of its load:

- `offered`: requests sent (at least once);
- `refused`: requests whose last answer was a 429 (never served); `refusals`: 429 answers in
  all (a retried request may collect several); `retried` / `served_after_retry`: requests
  sent again after a 429, and those of them that were then served;
- `retry_after_mean` / `retry_after_max`: the servers' Retry-After values, seconds;
- `within_slo`, `goodput` (requests within SLO per second of the run) and `slo_attainment`
  (within SLO / offered: refused requests count as offered, never as good).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from heddle.metrics.record import RequestRecord
from heddle.metrics.summary import OVERALL, SLO, is_completed, meets_slo


class Answer(Protocol):
    """A request's final outcome as both stream clients give it (heddle.bench.stream.Outcome,
    heddle.bench.chat_stream.ChatOutcome): the record, and the refusal apart from the error."""

    @property
    def record(self) -> RequestRecord: ...
    @property
    def error(self) -> str | None: ...
    @property
    def refused(self) -> bool: ...
    @property
    def retry_after(self) -> float | None: ...
    @property
    def num_refusals(self) -> int: ...


@dataclass(slots=True)
class ClassRefusals:
    request_class: str
    offered: int = 0
    served: int = 0  # completed
    refused: int = 0  # last answer a 429
    refusals: int = 0  # 429 answers in all
    retried: int = 0
    served_after_retry: int = 0
    retry_after_mean: float | None = None
    retry_after_max: float | None = None
    within_slo: int | None = None
    goodput: float | None = None  # within SLO per second of the run
    slo_attainment: float | None = None  # within SLO / offered

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class RefusalReport:
    retry_refused: int  # retries the client allowed per request after a 429 (0: none)
    classes: dict[str, ClassRefusals]  # by class, sorted, then "all"

    @property
    def honoured(self) -> bool:
        """Whether the client sent refused requests again after their Retry-After."""
        return self.retry_refused > 0

    @property
    def overall(self) -> ClassRefusals:
        return self.classes[OVERALL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "retry_after_honoured": self.honoured,
            "retry_refused": self.retry_refused,
            "classes": {name: c.to_dict() for name, c in self.classes.items()},
        }

    def line(self) -> str:
        """One line for the console report."""
        o = self.overall
        text = f"refused (HTTP 429): {o.refused} of {o.offered} offered"
        if o.refusals:
            text += f", {o.refusals} 429 answers, Retry-After mean {o.retry_after_mean:.1f} s"
            text += f" (max {o.retry_after_max:.0f} s)"
        if self.honoured:
            text += (
                f"; Retry-After honoured (up to {self.retry_refused} retries): "
                f"{o.served_after_retry} of {o.retried} retried served"
            )
        else:
            text += "; Retry-After not honoured (no retries: --retry-refused N)"
        if o.slo_attainment is not None:
            text += f"; within SLO {o.slo_attainment:.1%} of offered"
        return text


def refusal_report(
    outcomes: Sequence[Answer], duration: float, slo: SLO | None, retry_refused: int
) -> RefusalReport:
    """Per class and overall, from every request's final outcome."""
    by_class: dict[str, list[Answer]] = {}
    for o in outcomes:
        by_class.setdefault(o.record.request_class, []).append(o)
    with_slo = slo is not None or any(
        o.record.ttft_slo is not None or o.record.tpot_slo is not None for o in outcomes
    )
    classes = {
        name: _class(name, by_class[name], duration, slo, with_slo) for name in sorted(by_class)
    }
    classes[OVERALL] = _class(OVERALL, outcomes, duration, slo, with_slo)
    return RefusalReport(retry_refused, classes)


def _class(
    name: str, outcomes: Sequence[Answer], duration: float, slo: SLO | None, with_slo: bool
) -> ClassRefusals:
    out = ClassRefusals(name, offered=len(outcomes))
    retry_afters: list[float] = []
    within = 0
    for o in outcomes:
        served = not o.refused and o.error is None and is_completed(o.record)
        out.served += served
        out.refused += o.refused
        out.refusals += o.num_refusals
        retried = o.num_refusals > 1 or (o.num_refusals == 1 and not o.refused)
        out.retried += retried
        out.served_after_retry += retried and served
        if o.retry_after is not None:
            retry_afters.append(o.retry_after)
        within += served and meets_slo(o.record, slo)
    if retry_afters:
        out.retry_after_mean = sum(retry_afters) / len(retry_afters)
        out.retry_after_max = max(retry_afters)
    if with_slo:
        out.within_slo = within
        out.goodput = within / duration if duration > 0 else 0.0
        out.slo_attainment = within / out.offered if out.offered else None
    return out
