"""How many draft tokens each request gets this step: a goodput decision, per request.

Upstream, the number of speculative tokens K is a function of the batch size (vLLM's dynamic
speculative decoding keeps a lookup table per batch-size range; issue #49548 shows throughput
collapsing when concurrency crosses its threshold). Here K is chosen per request and per step
from three estimates, in the manner of SmartSpec (Liu et al. 2024, arXiv:2406.14066):

- the request's own acceptance rate `a` (`AcceptanceTracker`): the chance that a draft token
  is accepted given the ones before it were, counted per draft position (a run of j accepted
  drafts out of k is j successes and, if j < k, one failure), decayed so that it follows the
  request, and shrunk towards the rate of all requests until the request has its own history;
- what a step costs as a function of the tokens it computes (`StepCostTable`): learnt online
  from the durations of the steps the engine ran (measured on the real engine, predicted by
  the cost model in the simulator), per quarter-octave bucket of tokens, interpolated;
- the step's batch: the tokens the other rows already compute.

The j-th draft token of a request is accepted with probability a^j, so it is worth a^j tokens
(times the request's weight: a request with a TPOT objective counts double). Draft tokens are
ordered greedily, most valuable first, and the step takes the prefix of that order with the
most expected tokens per second (value over the step's cost with them), if it beats the step
without drafts by at least MIN_GAIN. Where the verified tokens cost more than they save -- a
big batch on a compute-bound device -- nothing is added and the step is exactly the step
without speculation, so adaptive speculation is never worse than none by more than the
estimates' error (the benchmark in docs/SPECULATION.md measures that).

Pure Python, no torch: the scheduler side uses it.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class AcceptanceTracker:
    """Per-request acceptance rate of draft tokens, with a prior from all requests."""

    def __init__(
        self, prior_rate: float = 0.5, prior_weight: float = 4.0, decay: float = 0.95
    ) -> None:
        if not 0.0 <= prior_rate <= 1.0 or prior_weight <= 0 or not 0.0 < decay <= 1.0:
            raise ValueError("bad acceptance tracker options")
        self.prior_weight = prior_weight
        self.decay = decay
        # All requests: a slower decay (it is the prior of requests without a history).
        self._global = [prior_rate * prior_weight, prior_weight]
        self._requests: dict[str, list[float]] = {}  # request id -> [successes, trials]
        self.num_drafted = 0
        self.num_accepted = 0

    @property
    def global_rate(self) -> float:
        successes, trials = self._global
        return successes / trials

    def rate(self, request_id: str) -> float:
        prior = self.global_rate
        own = self._requests.get(request_id)
        if own is None:
            return prior
        successes, trials = own
        return (successes + self.prior_weight * prior) / (trials + self.prior_weight)

    def observe(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """A step verified `num_drafts` drafts of the request and accepted the first
        `num_accepted` of them."""
        if num_drafts <= 0:
            return
        if not 0 <= num_accepted <= num_drafts:
            raise ValueError(f"accepted {num_accepted} of {num_drafts} drafts")
        trials = num_accepted + (num_accepted < num_drafts)
        own = self._requests.setdefault(request_id, [0.0, 0.0])
        own[0] = own[0] * self.decay + num_accepted
        own[1] = own[1] * self.decay + trials
        g = self._global
        slow = 1.0 - (1.0 - self.decay) / 16
        g[0] = g[0] * slow + num_accepted
        g[1] = g[1] * slow + trials
        self.num_drafted += num_drafts
        self.num_accepted += num_accepted

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._requests.pop(request_id, None)


class StepCostTable:
    """Step duration as a function of the tokens computed: a decayed mean per bucket of tokens,
    interpolated linearly in tokens between the buckets seen. A bucket is one token count up
    to EXACT_TOKENS (a step's cost is a staircase there: the CPU's bf16 matmuls work in tiles
    of 16 rows and quantization auto switches kernels at 4-8 rows, so 64 rows and 64 rows plus
    6 drafts cost 76 vs 92 ms on the embedded model, docs/SPECULATION.md), four per doubling
    above it.

    Beyond the largest bucket seen, cost grows in proportion to tokens (a step size never run
    is assumed compute-bound, so drafts are not added there on a guess); below the smallest,
    it is the smallest's. Drafts are only weighed against a step whose own size has been seen
    (`has`): steps with drafts teach the table only their own size, so when the size without
    drafts is unknown (or forgotten), that step runs without them and is learnt. Before any
    step, every cost is unknown (`known` is False).
    """

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self._sum: dict[int, float] = {}  # bucket -> decayed (sum of durations, count, tokens)
        self._count: dict[int, float] = {}
        self._tokens: dict[int, float] = {}
        self._points: list[tuple[float, float]] | None = None

    @property
    def known(self) -> bool:
        return bool(self._sum)

    def has(self, num_tokens: int) -> bool:
        """Whether a step of about `num_tokens` tokens (its bucket) was seen."""
        return _bucket(max(1, num_tokens)) in self._sum

    def observe(self, num_tokens: int, duration: float) -> None:
        if num_tokens <= 0 or not duration > 0 or not math.isfinite(duration):
            return
        bucket = _bucket(num_tokens)
        d = self.decay
        self._sum[bucket] = self._sum.get(bucket, 0.0) * d + duration
        self._count[bucket] = self._count.get(bucket, 0.0) * d + 1.0
        self._tokens[bucket] = self._tokens.get(bucket, 0.0) * d + num_tokens
        self._points = None

    def points(self) -> list[tuple[float, float]]:
        """(mean tokens, mean duration) per bucket, by tokens; durations made non-decreasing."""
        if self._points is None:
            points = sorted(
                (self._tokens[b] / self._count[b], self._sum[b] / self._count[b])
                for b in self._sum
            )
            rising: list[tuple[float, float]] = []
            for tokens, duration in points:
                if rising and duration < rising[-1][1]:
                    duration = rising[-1][1]  # more tokens never cost less
                rising.append((tokens, duration))
            self._points = rising
        return self._points

    def cost(self, num_tokens: float) -> float:
        points = self.points()
        if not points:
            return math.nan
        xs = [x for x, _ in points]
        i = bisect.bisect_left(xs, num_tokens)
        if i == 0:
            return points[0][1]
        if i == len(points):
            x, y = points[-1]
            return y * num_tokens / x
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return y0 + (y1 - y0) * (num_tokens - x0) / (x1 - x0)


# Steps of up to this many tokens have a bucket of their own (StepCostTable).
EXACT_TOKENS = 128
_EXACT_LOG = int(4.0 * math.log2(EXACT_TOKENS))


def _bucket(num_tokens: int) -> int:
    if num_tokens <= EXACT_TOKENS:
        return num_tokens
    return EXACT_TOKENS + int(4.0 * math.log2(num_tokens)) - _EXACT_LOG


@dataclass(slots=True)
class DraftCandidate:
    """A request that decodes this step and has draft tokens on offer."""

    request_id: str
    rate: float  # its acceptance rate
    max_drafts: int  # drafts on offer (a proposal may be shorter than the most allowed)
    weight: float = 1.0  # tokens of this request count `weight` times (an SLO request: more)


# Drafts are added only where they are expected to raise the step's tokens per second by at
# least this share: below it the gain is within the error of the estimates (the step cost
# table's noise, the acceptance rates), and a step with drafts that does not pay costs more
# than the same step without them (the verify rows' logits, the proposal); measured on the
# real CPU engine, docs/SPECULATION.md.
MIN_GAIN = 0.05


def choose_draft_counts(
    candidates: Sequence[DraftCandidate],
    base_tokens: int,
    base_value: float,
    cost: StepCostTable,
    token_budget: int,
    min_gain: float = MIN_GAIN,
) -> dict[str, int]:
    """Draft tokens per request for a step that already computes `base_tokens` tokens worth
    `base_value` (its sampled tokens, weighted). Drafts are taken greedily by value
    a^j * weight (at most `token_budget` in all), and the step gets the prefix of that order
    with the most expected value per second -- not just the drafts that each pay on their own:
    a step's cost need not be convex in its tokens (a kernel switch at some row count makes the
    first draft dear and the next ones cheap). None unless that beats the step without drafts
    by `min_gain`, and none when no step of the base size was seen (it runs without drafts,
    and so is learnt)."""
    if not candidates or token_budget <= 0 or not cost.has(base_tokens):
        return {}
    heap: list[tuple[float, int, int]] = []  # (-value of the next draft, index, its j)
    for index, c in enumerate(candidates):
        if c.max_drafts > 0 and c.rate > 0:
            heapq.heappush(heap, (-c.rate * c.weight, index, 1))
    order: list[tuple[str, int]] = []  # (request id, j) in the order they are added
    tokens = max(1, base_tokens)
    value = base_value
    base_rate = value / cost.cost(tokens)
    best_rate, best_len = base_rate * (1.0 + min_gain), 0
    while heap and token_budget > 0:
        negative, index, j = heapq.heappop(heap)
        candidate = candidates[index]
        order.append((candidate.request_id, j))
        tokens += 1
        value -= negative
        token_budget -= 1
        rate = value / cost.cost(tokens)
        if rate > best_rate:
            best_rate, best_len = rate, len(order)
        if j < candidate.max_drafts:
            heapq.heappush(heap, (negative * candidate.rate, index, j + 1))
    return dict(order[:best_len])  # a request's later j overwrites its earlier ones


def may_pay(
    base_tokens: int,
    base_value: float,
    best_draft_value: float,
    max_drafts: int,
    cost: StepCostTable,
    min_gain: float = MIN_GAIN,
) -> bool:
    """Whether any set of at most `max_drafts` drafts, none worth more than
    `best_draft_value` tokens, could beat the step without them by `min_gain` (what
    `choose_draft_counts` asks of the prefix it takes): an upper bound, decided before any
    proposal is looked up. L drafts are worth at most L * best_draft_value; the step cost is
    linear in tokens between the table's points (and in proportion beyond the last), so
    (value + L * best) / cost(tokens + L) is monotone on each piece and its largest value is
    at a piece's end: L = 1, L = max_drafts, or a point of the table in between."""
    if max_drafts <= 0 or best_draft_value <= 0 or not cost.has(base_tokens):
        return False
    tokens = max(1, base_tokens)
    threshold = base_value / cost.cost(tokens) * (1.0 + min_gain)
    ends = {1, max_drafts}
    for x, _ in cost.points():
        if tokens < x < tokens + max_drafts:
            ends.add(math.floor(x - tokens))
            ends.add(math.ceil(x - tokens))
    return any(
        (base_value + n * best_draft_value) / cost.cost(tokens + n) > threshold
        for n in ends if 1 <= n <= max_drafts
    )
