"""Time-varying load: bursts and diurnal ramps on top of a base rate.

A `RateProfile` multiplies a workload's base `rate` over time; arrivals are a Poisson process
of that varying intensity (drawn by thinning), so `rate` keeps its meaning of "1x load":

- `burst`: `calm`x for `start_seconds`, then repeatedly `peak`x for `peak_seconds` and `calm`x
  for `calm_seconds` (defaults: 2.5x for 30 s, then 0.7x for 180 s: long enough to drain what a
  burst queued, since a 2.5x burst of 30 s leaves 45 s of work at 1x and 0.7x drains 0.3 s of
  it per second);
- `diurnal`: a smooth day compressed into `period` seconds, from `low`x at t=0 up to `high`x at
  period/2 and back (a raised cosine).

Both are named by an arrival spec string, the `arrival` option of every workload and the
`--arrival` flag of `heddle simulate` and `heddle bench serve`:

    "burst"                                   the defaults
    "burst:peak=3,peak_seconds=30,calm=0.7"   options after a colon, KEY=VALUE, comma-separated
    "diurnal:low=0.3,high=2,period=600"

`phase_of(spec, t)` labels an arrival time "burst" or "calm" (diurnal: "rising" / "falling"),
so a report can keep the transient part of a run apart from the rest.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from heddle.errors import HeddleError

PROFILE_KINDS = ("burst", "diurnal")


@dataclass(frozen=True, slots=True)
class BurstProfile:
    peak: float = 2.5
    peak_seconds: float = 30.0
    calm: float = 0.7
    calm_seconds: float = 180.0
    start_seconds: float = 60.0

    def __post_init__(self) -> None:
        _positive(self, "peak", "peak_seconds", "calm", "calm_seconds")
        if not (math.isfinite(self.start_seconds) and self.start_seconds >= 0):
            raise HeddleError(f"burst: start_seconds must be >= 0, got {self.start_seconds}")

    @property
    def max_multiplier(self) -> float:
        return max(self.peak, self.calm)

    @property
    def mean_multiplier(self) -> float:
        """The long-run mean of the multiplier (over whole burst + calm cycles)."""
        cycle = self.peak_seconds + self.calm_seconds
        return (self.peak * self.peak_seconds + self.calm * self.calm_seconds) / cycle

    def phase(self, t: float) -> str:
        if t < self.start_seconds:
            return "calm"
        into = (t - self.start_seconds) % (self.peak_seconds + self.calm_seconds)
        return "burst" if into < self.peak_seconds else "calm"

    def multiplier(self, t: float) -> float:
        return self.peak if self.phase(t) == "burst" else self.calm

    def spans(self, end: float) -> dict[str, list[tuple[float, float]]]:
        """{phase: [(start, end), ...]} covering [0, end)."""
        cuts = [("calm", 0.0)]
        t = self.start_seconds
        while t < end:
            cuts += [("burst", t), ("calm", t + self.peak_seconds)]
            t += self.peak_seconds + self.calm_seconds
        return _spans(cuts, end)


@dataclass(frozen=True, slots=True)
class DiurnalProfile:
    low: float = 0.5
    high: float = 1.5
    period: float = 600.0

    def __post_init__(self) -> None:
        _positive(self, "low", "high", "period")
        if self.low > self.high:
            raise HeddleError(f"diurnal: low ({self.low}) must be <= high ({self.high})")

    @property
    def max_multiplier(self) -> float:
        return self.high

    @property
    def mean_multiplier(self) -> float:
        return (self.low + self.high) / 2

    def phase(self, t: float) -> str:
        return "rising" if (t % self.period) < self.period / 2 else "falling"

    def spans(self, end: float) -> dict[str, list[tuple[float, float]]]:
        """{phase: [(start, end), ...]} covering [0, end)."""
        cuts = []
        t = 0.0
        while t < end:
            cuts += [("rising", t), ("falling", t + self.period / 2)]
            t += self.period
        return _spans(cuts, end)

    def multiplier(self, t: float) -> float:
        swing = (1 - math.cos(2 * math.pi * t / self.period)) / 2  # 0 at t=0, 1 at period/2
        return self.low + (self.high - self.low) * swing


RateProfile = BurstProfile | DiurnalProfile
_KINDS: dict[str, Callable[..., RateProfile]] = {"burst": BurstProfile, "diurnal": DiurnalProfile}


def is_profile_spec(spec: str) -> bool:
    """Whether an arrival spec names a rate profile ("burst", "diurnal:period=300", ...)."""
    return spec.partition(":")[0].strip().lower() in PROFILE_KINDS


def parse_profile(spec: str) -> RateProfile:
    """ "burst:peak=3,calm_seconds=120" -> BurstProfile(peak=3.0, calm_seconds=120.0)."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in _KINDS:
        raise HeddleError(f"unknown rate profile {kind!r}; known: {', '.join(PROFILE_KINDS)}")
    factory = _KINDS[kind]
    fields = factory.__dataclass_fields__  # type: ignore[attr-defined]
    options: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise HeddleError(
                f"arrival {spec!r}: expected KEY=VALUE with KEY one of {', '.join(fields)}, "
                f"got {part!r}"
            )
        try:
            options[key] = float(raw)
        except ValueError:
            raise HeddleError(f"arrival {spec!r}: {key}={raw!r} is not a number") from None
    return factory(**options)


def profile_arrivals(profile: RateProfile, rate: float, n: int, rng: random.Random) -> list[float]:
    """`n` arrival times of a Poisson process of intensity rate * profile.multiplier(t).

    The first request arrives at t=0, as with every arrival process; the rest by thinning a
    Poisson process at the profile's peak intensity (exact for any bounded intensity).
    """
    if n < 0:
        raise HeddleError(f"number of requests must be >= 0, got {n}")
    if not (rate > 0 and math.isfinite(rate)):
        raise HeddleError(f"a rate profile needs a finite positive base rate, got {rate}")
    peak = rate * profile.max_multiplier
    times = [0.0] * n
    t = 0.0
    for i in range(1, n):
        while True:
            t += rng.expovariate(peak)
            if rng.random() * peak < rate * profile.multiplier(t):
                break
        times[i] = t
    return times


def phase_of(spec: str | None, t: float) -> str:
    """The phase of the load at arrival time `t` under arrival spec `spec`: "burst" / "calm"
    (burst), "rising" / "falling" (diurnal), "sustained" (any other arrival process)."""
    if spec is None or not is_profile_spec(spec):
        return "sustained"
    return parse_profile(spec).phase(t)


def _spans(cuts: list[tuple[str, float]], end: float) -> dict[str, list[tuple[float, float]]]:
    """Phases from their start times (ascending), cut at `end`; empty spans dropped."""
    out: dict[str, list[tuple[float, float]]] = {}
    for (phase, start), (_, stop) in zip(cuts, [*cuts[1:], ("", end)], strict=True):
        stop = min(stop, end)
        if stop > start:
            out.setdefault(phase, []).append((start, stop))
    return out


def _positive(profile: object, *names: str) -> None:
    for name in names:
        value = getattr(profile, name)
        if not (value > 0 and math.isfinite(value)):
            kind = type(profile).__name__.removesuffix("Profile").lower()
            raise HeddleError(f"{kind}: {name} must be positive and finite, got {value}")
