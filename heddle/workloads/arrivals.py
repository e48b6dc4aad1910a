"""Arrival processes: when requests reach the server, in seconds from the start of the run.

Every process starts at t=0 (the first request arrives with the run) and is deterministic given
its `random.Random`. Besides the stationary processes here, "burst" and "diurnal" (with options:
"burst:peak=3,peak_seconds=30") vary the rate over time (heddle/workloads/bursts.py).
"""

from __future__ import annotations

import math
import random

from heddle.errors import HeddleError
from heddle.workloads.bursts import PROFILE_KINDS, is_profile_spec, parse_profile, profile_arrivals

ARRIVAL_PROCESSES = ("poisson", "gamma", "all-at-once", *PROFILE_KINDS)


def all_at_once(n: int) -> list[float]:
    """Every request at t=0: an offered load of rate=inf."""
    _check_n(n)
    return [0.0] * n


def poisson(rate: float, n: int, rng: random.Random) -> list[float]:
    """Exponential gaps of mean 1/rate. rate=inf gives all_at_once."""
    return gamma(rate, 1.0, n, rng)


def gamma(rate: float, cv: float, n: int, rng: random.Random) -> list[float]:
    """Gamma-distributed gaps of mean 1/rate and coefficient of variation `cv`.

    cv=1 is a Poisson process; cv>1 is bursty (clusters of near-simultaneous arrivals separated
    by long quiet periods); cv<1 is more regular than Poisson.
    """
    _check_n(n)
    if rate <= 0 or math.isnan(rate):
        raise HeddleError(f"arrival rate must be positive, got {rate}")
    if cv <= 0 or not math.isfinite(cv):
        raise HeddleError(f"arrival cv must be positive and finite, got {cv}")
    if math.isinf(rate):
        return all_at_once(n)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    times = [0.0] * n
    t = 0.0
    for i in range(1, n):
        t += rng.gammavariate(shape, scale)
        times[i] = t
    return times


def arrival_times(
    process: str, rate: float, n: int, rng: random.Random, cv: float = 1.0
) -> list[float]:
    """Dispatch by name: "poisson", "gamma" (uses cv), "all-at-once" (ignores rate), or a rate
    profile spec ("burst", "diurnal:period=300", ...: a Poisson process whose rate varies)."""
    if is_profile_spec(process):
        return profile_arrivals(parse_profile(process), rate, n, rng)
    name = process.replace("_", "-").lower()
    if name == "poisson":
        return poisson(rate, n, rng)
    if name == "gamma":
        return gamma(rate, cv, n, rng)
    if name == "all-at-once":
        return all_at_once(n)
    raise HeddleError(f"unknown arrival process {process!r}; known: {', '.join(ARRIVAL_PROCESSES)}")


def arrival_spec(text: str) -> str:
    """Validate an arrival process name or profile spec (an argparse `type`); returns it."""
    name = text.replace("_", "-").lower()
    if is_profile_spec(text):
        parse_profile(text)
        return text
    if name not in ARRIVAL_PROCESSES:
        raise HeddleError(
            f"unknown arrival process {text!r}; known: {', '.join(ARRIVAL_PROCESSES)} "
            "(profiles take options: burst:peak=3,peak_seconds=30)"
        )
    return text


def arrival_arg(text: str) -> str:
    """`arrival_spec` for argparse: a bad spec is a usage error (one line, exit status 2)."""
    import argparse

    try:
        return arrival_spec(text)
    except HeddleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _check_n(n: int) -> None:
    if n < 0:
        raise HeddleError(f"number of requests must be >= 0, got {n}")
