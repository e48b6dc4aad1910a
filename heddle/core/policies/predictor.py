"""Online output-length predictor for `sjf` (not a policy).

It learns from finished requests: a running mean of output length per
(request_class, user, prompt-length bucket), falling back to (class, bucket), then (class),
then the global mean, and to `default_output_len` before anything has finished. A client's
`output_len_hint` is used as is. Prompt lengths are bucketed by powers of two.

Accuracy is measured honestly: each request's error is that of the first prediction made for
it (when it was first ordered), not of a prediction made after more was learned.
"""

from __future__ import annotations

import bisect
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


# -- re-prediction of the remaining length ----------------------------------------------------

CHECKPOINTS = (0, 64, 256)  # generated tokens at which accuracy is recorded


@dataclass(slots=True)
class _Lengths:
    """A window of observed lengths, sorted on demand, for conditional residual means."""

    recent: deque[int]
    _sorted: list[int] | None = None
    _suffix: list[int] | None = None  # _suffix[i] = sum(_sorted[i:])

    def add(self, length: int) -> None:
        self.recent.append(length)
        self._sorted = self._suffix = None

    def residual(self, done: int) -> float | None:
        """Mean of (L - done) over the observed L > done; None when none is that long."""
        if self._sorted is None or self._suffix is None:
            self._sorted = sorted(self.recent)
            suffix = [0] * (len(self._sorted) + 1)
            for i in range(len(self._sorted) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + self._sorted[i]
            self._suffix = suffix
        first = bisect.bisect_right(self._sorted, done)
        count = len(self._sorted) - first
        if count == 0:
            return None
        return self._suffix[first] / count - done


class RemainingLenPredictor:
    """Re-predicts a request's remaining output tokens from what it has generated so far.

    A request is in one of two phases (`heddle.reasoning.Phase`; a request of a model without
    reasoning is answering from its first token). From finished requests it keeps, per class
    and over all classes, the lengths of thinking phases and of answers
    (the last `window` of each). The remaining length of a request `done` tokens into its
    phase is the empirical mean residual life, E[L - done | L > done], of that phase's
    lengths, plus (while thinking) the mean answer length: so it follows what the request has
    already shown (a thinking phase that ran long is expected to run longer, heavy tails and
    all) instead of scoring the prompt once. (Not per prompt-length bucket, unlike
    `OutputLenPredictor`: where output does not depend on the prompt, as on the simulator's
    workloads, per-bucket estimates only add noise that breaks ties within a class.)

    Past every length seen it predicts a quarter of what the phase has used so far, with one
    exception: with `use_max_tokens` (the default), a request whose class has not finished
    `min_samples` requests yet and that has outlived every length of all classes is predicted
    to run to its bound. Early in a run the requests that have finished are the short ones, so
    such a request is most likely of a long class none of whose members has finished (on real
    chat, docs/SPECULATION.md: stories, which end at max_tokens); once its class is learnt,
    outliving it is an anomaly, and the quarter holds. With `use_max_tokens` no prediction
    exceeds `max_output_tokens - num_output_tokens` either. Turn it off where
    `max_tokens` is not a client's bound but the answer: the simulator's replay sets it to each
    request's true length.

    Accuracy is recorded honestly: at each checkpoint (0, 64, 256 generated tokens) the
    prediction made then, by a predictor that has learnt only from requests finished before,
    is kept with the actual remaining length once the request finishes (`accuracy`).
    """

    def __init__(
        self,
        default_output_len: float = 128.0,
        min_samples: int = 8,
        window: int = 2048,
        checkpoints: tuple[int, ...] = CHECKPOINTS,
        use_max_tokens: bool = True,
    ) -> None:
        if default_output_len <= 0 or min_samples < 1 or window < 1:
            raise ValueError("bad predictor options")
        self.default_output_len = float(default_output_len)
        self.min_samples = min_samples
        self.window = window
        self.use_max_tokens = use_max_tokens
        self.num_outlived = 0  # predictions made past every length seen
        self.num_to_bound = 0  # of those, the ones predicted to run to the request's bound
        self.checkpoints = tuple(sorted(checkpoints))
        self._thinking: dict[_Key, _Lengths] = {}
        self._answer: dict[_Key, _Lengths] = {}
        self._pending: dict[str, dict[int, tuple[float, int]]] = {}
        # checkpoint -> [(predicted remaining, actual remaining, request id)], in finish order
        self.accuracy: dict[int, list[tuple[float, int, str]]] = {c: [] for c in self.checkpoints}

    @staticmethod
    def _keys(request: Request) -> list[_Key]:
        return [("c", request.request_class), ("all",)]

    def _lengths(self, table: dict[_Key, _Lengths], request: Request) -> _Lengths | None:
        for key in self._keys(request):
            entry = table.get(key)
            if entry is not None and len(entry.recent) >= self.min_samples:
                return entry
        return None

    def _residual(self, table: dict[_Key, _Lengths], request: Request, done: int,
                  ) -> tuple[float | None, bool]:
        """The phase's mean residual life `done` tokens in (None past every length seen), and
        whether it came from the request's own class (not the all-classes fallback)."""
        entry = self._lengths(table, request)
        if entry is None:
            return max(1.0, self.default_output_len - done), False
        residual = entry.residual(done)
        own = entry is table.get(("c", request.request_class))
        return (None if residual is None else max(1.0, residual)), own

    def predict_remaining(self, request: Request) -> float:
        """Predicted output tokens still to come (>= 1)."""
        state = request.reasoning
        thinking = state is not None and state.is_thinking
        table = self._thinking if thinking else self._answer
        done = state.tokens_in_phase if state is not None else request.num_output_tokens
        remaining, own_class = self._residual(table, request, done)
        # A bound only where the client or the model set one (not the "unbounded" 2**62).
        bounded = self.use_max_tokens and (request.sampling_params.max_tokens is not None
                                           or request.max_model_len is not None)
        bound = max(1, request.max_output_tokens - request.num_output_tokens)
        outlived = remaining is None
        if remaining is None:
            self.num_outlived += 1
            remaining = max(1.0, 0.25 * done)
        if thinking:
            answer = self._lengths(self._answer, request)
            if answer is not None:
                remaining += answer.residual(0) or 0.0
        if outlived and bounded and not own_class:
            self.num_to_bound += 1
            remaining = float(bound)  # the answer too is inside the bound
        elif bounded:
            remaining = min(remaining, float(bound))
        self._record(request, remaining)
        return remaining

    def _record(self, request: Request, remaining: float) -> None:
        generated = request.num_output_tokens
        pending = self._pending.setdefault(request.request_id, {})
        for checkpoint in self.checkpoints:
            if checkpoint > generated:
                break
            # The first prediction at or past the checkpoint, made before any later one.
            if checkpoint not in pending and generated - checkpoint < 16:
                pending[checkpoint] = (remaining, generated)

    def observe(self, request: Request) -> None:
        """Learn the phase lengths of a finished request; score its recorded predictions."""
        pending = self._pending.pop(request.request_id, {})
        if request.finish_reason is FinishReason.ABORT or request.num_output_tokens == 0:
            return
        total = request.num_output_tokens
        for checkpoint, (predicted, generated) in pending.items():
            self.accuracy[checkpoint].append((predicted, total - generated, request.request_id))
        state = request.reasoning
        thinking: int | None = None  # None: the request did not think
        answer: int | None = total
        if state is not None and state.num_blocks:
            if state.is_thinking:
                thinking, answer = total, None  # cut off while thinking: no answer seen
            else:
                thinking, answer = state.phase_start, total - state.phase_start
        for key in self._keys(request):
            if thinking is not None:
                self._table(self._thinking, key).add(thinking)
            if answer is not None:
                self._table(self._answer, key).add(answer)

    def _table(self, table: dict[_Key, _Lengths], key: _Key) -> _Lengths:
        entry = table.get(key)
        if entry is None:
            entry = table[key] = _Lengths(deque(maxlen=self.window))
        return entry
