"""How long a paused session will stay paused: learned online, the client's hint as prior.

A tool's time is modelled as lognormal (tool latencies are heavy-tailed: most calls are quick,
a few take minutes). Its log-mean and log-variance are estimated per tool from the pauses seen
so far, shrunk towards a prior: the hint the request carried (`expected_pause`) when there is
one, else what the engine has seen of all tools. A session's own pauses count more than other
sessions' (the same program tends to repeat its tools' times).

`remaining(elapsed)` is the expected time left given the pause has already lasted `elapsed`:
the mean residual life of the lognormal, which grows with `elapsed` for heavy tails. A tool
that runs 10x longer than expected therefore looks longer and longer while it runs, and the
retention policy gives its memory up without needing a timeout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_PAUSE = 1.0  # seconds, before anything was seen or hinted
DEFAULT_SIGMA = 1.0  # log-space spread before anything was seen
PRIOR_WEIGHT = 2.0  # pseudo-observations a hint is worth
SESSION_WEIGHT = 4.0  # how much more a session's own pause counts than another session's
MIN_PAUSE = 1e-3  # seconds: pauses are floored here before taking logs


@dataclass(slots=True)
class _LogStats:
    """Weighted count, mean and sum of squared deviations of log pauses (Welford)."""

    weight: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, value: float, weight: float = 1.0) -> None:
        self.weight += weight
        delta = value - self.mean
        self.mean += delta * weight / self.weight
        self.m2 += weight * delta * (value - self.mean)

    @property
    def variance(self) -> float | None:
        return self.m2 / self.weight if self.weight > 1.0 else None


@dataclass(frozen=True, slots=True)
class PauseEstimate:
    """A lognormal belief about one pause: log-mean `mu`, log-sd `sigma`."""

    mu: float
    sigma: float

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma * self.sigma / 2)

    def remaining(self, elapsed: float) -> float:
        """E[P - elapsed | P > elapsed] for P lognormal(mu, sigma)."""
        if elapsed <= 0:
            return self.mean
        z = (math.log(elapsed) - self.mu) / self.sigma
        survive = _upper_tail(z)
        if survive < 1e-12:  # far beyond anything seen: the tail is all we have
            return elapsed * max(1.0, self.sigma * self.sigma)
        conditional = self.mean * _upper_tail(z - self.sigma) / survive
        return max(0.0, conditional - elapsed)


def _upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


class PauseEstimator:
    """Per-tool (and per-session) lognormal beliefs about pauses, updated as they are seen."""

    def __init__(
        self,
        default_pause: float = DEFAULT_PAUSE,
        default_sigma: float = DEFAULT_SIGMA,
        prior_weight: float = PRIOR_WEIGHT,
    ) -> None:
        if default_pause <= 0 or default_sigma <= 0 or prior_weight < 0:
            raise ValueError("pause defaults must be positive and the prior weight >= 0")
        self.default_pause = default_pause
        self.default_sigma = default_sigma
        self.prior_weight = prior_weight
        self._tools: dict[str, _LogStats] = {}
        self._sessions: dict[tuple[str, str], _LogStats] = {}
        self._all = _LogStats()

    def observe(self, session_id: str, tool: str | None, pause: float) -> None:
        """A pause of `pause` seconds ended: the session's next turn arrived."""
        value = math.log(max(MIN_PAUSE, pause))
        key = tool or ""
        self._tools.setdefault(key, _LogStats()).add(value)
        self._sessions.setdefault((session_id, key), _LogStats()).add(value)
        self._all.add(value)

    def forget(self, session_id: str) -> None:
        """The session ended: drop what is kept for it alone."""
        for key in [k for k in self._sessions if k[0] == session_id]:
            del self._sessions[key]

    def estimate(self, session_id: str, tool: str | None, hint: float | None) -> PauseEstimate:
        """The belief about this session's next pause after a call that ran `tool`."""
        key = tool or ""
        if hint is not None and hint > 0:
            sigma0 = self._sigma_of(self._tools.get(key)) or self.default_sigma
            prior_mu = math.log(max(MIN_PAUSE, hint)) - sigma0 * sigma0 / 2
            prior_weight = self.prior_weight
        else:
            base = self._tools.get(key) or self._all
            sigma0 = self._sigma_of(base) or self.default_sigma
            if base.weight > 0:
                prior_mu, prior_weight = base.mean, 0.0
            else:
                prior_mu = math.log(self.default_pause) - sigma0 * sigma0 / 2
                prior_weight = self.prior_weight
        combined = _LogStats()
        if prior_weight > 0:
            combined.add(prior_mu, prior_weight)
        tool_stats = self._tools.get(key)
        session_stats = self._sessions.get((session_id, key))
        for stats, weight in ((tool_stats, 1.0), (session_stats, SESSION_WEIGHT)):
            if stats is not None and stats.weight > 0:
                combined.add(stats.mean, stats.weight * weight)
        mu = combined.mean if combined.weight > 0 else prior_mu
        sigma = self._sigma_of(tool_stats) or sigma0
        return PauseEstimate(mu, max(0.05, sigma))

    @staticmethod
    def _sigma_of(stats: _LogStats | None) -> float | None:
        if stats is None:
            return None
        variance = stats.variance
        return math.sqrt(variance) if variance is not None and variance > 0 else None
