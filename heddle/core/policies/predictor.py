"""Online output-length predictor for `sjf` (not a policy).

It learns from finished requests: a running mean of output length per
(request_class, user, prompt-length bucket), falling back to (class, bucket), then (class),
then the global mean, and to `default_output_len` before anything has finished. A client's
`output_len_hint` is used as is. Prompt lengths are bucketed by powers of two.

Accuracy is measured honestly: each request's error is that of the first prediction made for
it (when it was first ordered), not of a prediction made after more was learned.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heddle.request import FinishReason

if TYPE_CHECKING:
    from heddle.request import Request

_Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class PredictorStats:
    """Mean absolute error (tokens) and mean relative error, overall and over a recent window."""

    num_samples: int
    mean_abs_error: float
    mean_rel_error: float
    recent_abs_error: float
    recent_rel_error: float


@dataclass(slots=True)
class _Mean:
    count: int = 0
    mean: float = 0.0

    def add(self, value: float, min_rate: float) -> None:
        self.count += 1
        # A plain mean at first, then a slowly moving one so the predictor follows drift.
        self.mean += max(1.0 / self.count, min_rate) * (value - self.mean)


class OutputLenPredictor:
    def __init__(
        self,
        default_output_len: float = 128.0,
        min_samples: int = 2,
        min_rate: float = 0.02,
        window: int = 100,
    ) -> None:
        if default_output_len <= 0 or min_samples < 1 or not 0 <= min_rate <= 1 or window < 1:
            raise ValueError("bad predictor options")
        self.default_output_len = float(default_output_len)
        self.min_samples = min_samples
        self.min_rate = min_rate
        self._means: dict[_Key, _Mean] = {}
        self._first_prediction: dict[str, float] = {}
        self._num_samples = 0
        self._sum_abs = 0.0
        self._sum_rel = 0.0
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)

    @staticmethod
    def _keys(request: Request) -> list[_Key]:
        bucket = request.num_prompt_tokens.bit_length()  # 2**(b-1) <= len < 2**b
        cls, user = request.request_class, request.user
        return [("cu", cls, user, bucket), ("cb", cls, bucket), ("c", cls), ("all",)]

    def predict(self, request: Request) -> float:
        """Predicted total output length of `request` (tokens, >= 1)."""
        if request.output_len_hint is not None:
            prediction = float(max(1, request.output_len_hint))
        else:
            prediction = self.default_output_len
            for key in self._keys(request):
                entry = self._means.get(key)
                if entry is not None and entry.count >= self.min_samples:
                    prediction = max(1.0, entry.mean)
                    break
            else:
                entry = self._means.get(("all",))
                if entry is not None and entry.count:
                    prediction = max(1.0, entry.mean)
        self._first_prediction.setdefault(request.request_id, prediction)
        return prediction

    def observe(self, request: Request) -> None:
        """Learn from a finished request. Aborted ones tell nothing about length: skipped."""
        first = self._first_prediction.pop(request.request_id, None)
        if request.finish_reason is FinishReason.ABORT or request.num_output_tokens == 0:
            return
        actual = request.num_output_tokens
        if first is None:
            first = self.predict(request)
            self._first_prediction.pop(request.request_id, None)
        abs_error = abs(first - actual)
        rel_error = abs_error / actual
        self._num_samples += 1
        self._sum_abs += abs_error
        self._sum_rel += rel_error
        self._recent.append((abs_error, rel_error))
        for key in self._keys(request):
            self._means.setdefault(key, _Mean()).add(actual, self.min_rate)

    def stats(self) -> PredictorStats:
        n, recent = self._num_samples, self._recent
        return PredictorStats(
            num_samples=n,
            mean_abs_error=self._sum_abs / n if n else 0.0,
            mean_rel_error=self._sum_rel / n if n else 0.0,
            recent_abs_error=sum(a for a, _ in recent) / len(recent) if recent else 0.0,
            recent_rel_error=sum(r for _, r in recent) / len(recent) if recent else 0.0,
        )
