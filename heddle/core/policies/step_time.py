"""An online model of step time: seconds = base + per_token * scheduled tokens (not a policy).

Fitted by exponentially weighted least squares over the steps seen so far, so it follows
drifts (a warming cache, a growing context) and needs no profile. When every recent step had
the same number of tokens the slope cannot be told apart from the base; the model then assumes
time proportional to tokens, which over-predicts larger steps: the safe side for a cap.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepTimeModel:
    alpha: float = 0.1  # weight of the newest step
    num_steps: int = 0
    _mean_tokens: float = 0.0
    _mean_seconds: float = 0.0
    _mean_tokens_sq: float = 0.0
    _mean_tokens_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds < 0:
            return
        # The first steps are weighted as a plain mean, so early fits are not biased to zero.
        a = max(self.alpha, 1.0 / (self.num_steps + 1))
        self._mean_tokens += a * (num_tokens - self._mean_tokens)
        self._mean_seconds += a * (seconds - self._mean_seconds)
        self._mean_tokens_sq += a * (num_tokens * num_tokens - self._mean_tokens_sq)
        self._mean_tokens_seconds += a * (num_tokens * seconds - self._mean_tokens_seconds)
        self.num_steps += 1

    @property
    def fitted(self) -> bool:
        return self.num_steps > 0

    def coefficients(self) -> tuple[float, float]:
        """(base seconds per step, seconds per scheduled token), both >= 0."""
        if not self.fitted:
            return 0.0, 0.0
        mx, my = self._mean_tokens, self._mean_seconds
        variance = self._mean_tokens_sq - mx * mx
        if variance > 1e-9 * max(1.0, mx * mx):
            slope = (self._mean_tokens_seconds - mx * my) / variance
            base = my - slope * mx
            if slope >= 0 and base >= 0:
                return base, slope
            if slope >= 0:
                return 0.0, my / mx
            return my, 0.0
        return 0.0, my / mx

    def predict(self, num_tokens: int) -> float:
        base, per_token = self.coefficients()
        return base + per_token * num_tokens

    def max_tokens_within(self, seconds: float) -> int | None:
        """The most tokens a step may hold to last at most `seconds`; None: no limit known."""
        base, per_token = self.coefficients()
        if not self.fitted or per_token <= 0:
            return None
        return max(0, int((seconds - base) / per_token + 1e-9))
