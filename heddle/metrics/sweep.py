"""One point of a load sweep: what a configuration achieved at one offered load."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from heddle.metrics.summary import Summary


@dataclass(frozen=True, slots=True)
class SweepPoint:
    series: str  # the configuration swept, e.g. a policy name; one line per series in plots
    offered_load: float  # requests per second sent
    request_throughput: float
    output_throughput: float
    ttft_p99: float | None
    tpot_p99: float | None
    e2e_p99: float | None
    goodput: float | None = None

    @classmethod
    def from_summary(cls, series: str, offered_load: float, summary: Summary) -> SweepPoint:
        c = summary.overall
        return cls(
            series=series,
            offered_load=offered_load,
            request_throughput=c.request_throughput,
            output_throughput=c.output_throughput,
            ttft_p99=c.ttft.p99,
            tpot_p99=c.tpot.p99,
            e2e_p99=c.e2e.p99,
            goodput=c.goodput,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
