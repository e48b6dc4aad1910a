"""The idle warm-up's measurement: back to back, then after sleeps, on a fake executor."""

from __future__ import annotations

import pytest

from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.errors import HeddleError
from heddle.model.profiling_idle import fit_idle, idle_shapes, profile_idle
from heddle.sim.cost_model import StepShape


class _ColdAfterIdle:
    """A step costs 1 ms per token, plus 5 ms once it slept 50 ms or more (one clock)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.last_end = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def execute(self, so: SchedulerOutput) -> ExecutorOutput:
        cold = 0.005 if self.now - self.last_end >= 0.05 else 0.0
        self.now += 0.001 * so.num_scheduled_tokens + cold
        self.last_end = self.now
        return ExecutorOutput([[1] if s else [] for s in so.sample], 0.0)


def test_profile_idle_pairs_each_sleep_with_a_back_to_back_run_and_finds_the_warmup():
    fake = _ColdAfterIdle()
    shapes = idle_shapes(256, 32)
    assert len(shapes) == 3 and shapes[0].prefill_chunks and not shapes[1].prefill_chunks
    gaps = (0.001, 0.1, 1.0)
    samples = profile_idle(fake.execute, shapes, 16, gaps, repeats=2,
                           sleep=fake.sleep, clock=fake.clock)  # fmt: skip
    assert len(samples) == 2 * 3 * 3
    assert sorted(fake.sleeps[:3]) == sorted(gaps) and fake.sleeps[3:6] == list(gaps)
    assert fake.sleeps[9:12] == [0.1, 1.0, 0.001]  # the second round rotates the order
    for s in samples:
        assert s.back_to_back == pytest.approx(0.001 * shapes[s.shape_index].num_tokens)
        assert s.extra == pytest.approx(0.005 if s.sleep >= 0.05 else 0.0)
        assert s.gap == pytest.approx(s.sleep)
    warmup, check = fit_idle(samples, gaps)
    assert warmup.extra == pytest.approx((0.0, 0.005, 0.005))
    # Left-out shapes are predicted exactly with the warm-up, not without it.
    assert check["held_out_median_abs_with"] == pytest.approx(0.0)
    assert check["held_out_median_abs_without"] > 0.04
    base, *ratios = check["per_shape_base_s_and_ratio"]["1"]  # the lone decode: 1 ms
    assert base == pytest.approx(0.001) and ratios == pytest.approx([1.0, 6.0, 6.0])


def test_profile_idle_rejects_bad_settings():
    with pytest.raises(HeddleError, match="positive gaps"):
        profile_idle(lambda so: ExecutorOutput([], 0.0), [StepShape((), (4,))], 16, (0.0,))


def test_dispatch_rows_are_the_switches_of_the_layers_every_token_goes_through():
    from types import SimpleNamespace

    from heddle.model.profiling import dispatch_rows

    def layer(kind: str, max_rows: int, small: bool = True, large: bool = True) -> object:
        return SimpleNamespace(kind=kind, max_rows=max_rows, small=object() if small else None,
                               large=object() if large else None)  # fmt: skip

    built = [layer("qkv", 8), layer("o", 8), layer("down", 4), layer("gate_up", 0),
             layer("lm_head", 2), layer("qkv", 1 << 62), layer("o", 16, large=False)]  # fmt: skip
    executor = SimpleNamespace(model=SimpleNamespace(linears=SimpleNamespace(built=built)))
    assert dispatch_rows(executor) == (4, 8)
    assert dispatch_rows(SimpleNamespace()) == ()  # an executor without a linear plan
