"""Draft-token acceptance in the simulator.

A simulated request accepts each draft token with its own probability a (given the drafts
before it were accepted), so a step verifying k drafts accepts min(k, G) of them, G geometric.
Requests differ: a is drawn once per request, uniformly in [mean - spread, mean + spread]
(clipped to [0, 1]), from (seed, request id); each step's draws come from (seed, request id,
step id). So a run is the same every time, and the same request accepts the same way under any
policy that gives it the same drafts in the same step. `mean` and `spread` are per workload:
`MEASURED_ACCEPTANCE` has the rates measured on the real engine.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.config import SpeculativeConfig

_MASK64 = (1 << 64) - 1
_SCALE = float(1 << 53)


def _mix64(x: int) -> int:
    """SplitMix64's finaliser."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


# Per workload: (mean acceptance, spread, proposal rate) measured on the real engine, prompt
# lookup on the embedded SmolLM2-135M (docs/SPECULATION.md, "The real CPU engine":
# `benchmarks/speculation.py real --workload repetitive|chat ...`, fixed-K runs pooled).
MEASURED_ACCEPTANCE: dict[str, tuple[float, float, float]] = {
    "repetitive": (0.687, 0.020, 0.358),
    "chat": (0.636, 0.322, 0.072),
}


class SimAcceptance:
    def __init__(self, mean: float, spread: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= mean <= 1.0 or spread < 0:
            raise ValueError(f"need 0 <= acceptance mean <= 1 and spread >= 0: {mean}, {spread}")
        self.mean = mean
        self.spread = spread
        self.seed = seed
        self._rates: dict[str, float] = {}

    def rate(self, request_id: str) -> float:
        rate = self._rates.get(request_id)
        if rate is None:
            u = _mix64((self.seed << 32) ^ zlib.crc32(request_id.encode())) / float(1 << 64)
            rate = min(1.0, max(0.0, self.mean + self.spread * (2.0 * u - 1.0)))
            self._rates[request_id] = rate
        return rate

    def accepted(self, request_id: str, step_id: int, num_drafts: int) -> int:
        """How many of `num_drafts` drafts the request accepts in step `step_id`."""
        rate = self.rate(request_id)
        state = _mix64((self.seed << 40) ^ (zlib.crc32(request_id.encode()) << 20) ^ step_id)
        for i in range(num_drafts):
            state = _mix64(state)
            if (state >> 11) / _SCALE >= rate:
                return i
        return num_drafts

    def forget(self, request_id: str) -> None:
        self._rates.pop(request_id, None)


def sim_acceptance(config: SpeculativeConfig, seed: int = 0) -> SimAcceptance | None:
    """How the simulator accepts the drafts of `config`: None with speculation off. Any
    method is simulated the same way (the simulator has no text to look up or draft model to
    run): drafts accepted at the configured mean rate and spread."""
    if config.method == "off":
        return None
    return SimAcceptance(config.acceptance, config.acceptance_spread, seed)
