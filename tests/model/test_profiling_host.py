"""The engine's time around a step and an idle engine's wake: the fit, the measurement on the
real Engine and replay loop (over an executor that costs nothing), and what the simulator
charges for them."""

from __future__ import annotations

import pytest

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.errors import HeddleError
from heddle.model.profiling_host import HostProfile, fit_host, host_from_run, profile_host
from heddle.request import SamplingParams
from heddle.sim.cost_model import StepShape
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.profiled import ProfiledCostModel


def test_fit_host_is_a_line_through_the_median_gap_per_row_count():
    # 40 us + 3 us per row, with one 5 ms outlier (a GC pause) that a median ignores.
    points = [(rows, 40e-6 + 3e-6 * rows) for rows in (1, 2, 4, 8, 16, 32) for _ in range(5)]
    points.append((4, 5e-3))
    constant, per_row, error = fit_host(points)
    assert constant == pytest.approx(40e-6, rel=1e-3)
    assert per_row == pytest.approx(3e-6, rel=1e-3)
    assert error == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(HeddleError, match="no back-to-back steps"):
        fit_host([])
    with pytest.raises(HeddleError, match="bad host-time point"):
        fit_host([(0, 1e-4)])


def test_host_from_run_reads_only_back_to_back_gaps():
    steps = [(StepShape((), (10,) * b), 0.01) for b in (1, 2, 3, 4)]
    # A step that admits a request (a first prompt chunk) after 0.6 ms of the engine's work.
    steps.append((StepShape(((20, 20),), (10,) * 2, num_sampled=3), 0.03))
    # The first step has no gap, the third followed 50 ms of idle: neither is engine time.
    gaps = [None, 1e-4 + 1e-5 * 2, 0.05, 1e-4 + 1e-5 * 4, 6e-4]
    constant, per_row, _, used, per_new = host_from_run(steps, gaps)
    assert used == 2
    assert constant == pytest.approx(1e-4, rel=1e-6) and per_row == pytest.approx(1e-5, rel=1e-6)
    # Its excess over the line for its 3 rows: what admitting the request cost.
    assert per_new == pytest.approx(6e-4 - 1e-4 - 3e-5, rel=1e-6)


def test_profile_host_times_the_engine_loop():
    scheduler = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8)
    config = EngineConfig(cache=CacheConfig(block_size=16), scheduler=scheduler)
    host = profile_host(config, num_blocks=512, vocab_size=1000, max_model_len=4096,
                        num_requests=16, num_wakes=4, wake_rate=50.0)  # fmt: skip
    assert host.num_gaps > 10 and host.num_wakes == 4
    # Python between steps: positive and well under a millisecond per step here.
    assert 0 < host.host_constant + 8 * host.host_per_row < 2e-3
    assert 0 <= host.wake < 0.1 and 0 < host.host_per_new_request < 0.05
    assert set(host.by_rows) <= {str(r) for r in range(1, 9)}
    assert "engine time around a step" in host.lines()[0]
    assert HostProfile(**host.as_dict()) == host


def _new(request_id: str, context: int) -> NewRequest:
    return NewRequest(request_id, [1] * context, context, [0], SamplingParams(max_tokens=8))


def test_the_simulator_charges_engine_time_every_step_and_the_wake_after_idle():
    price = ProfiledCostModel({"constant": 0.01})
    model = price.with_host(1e-4, 1e-5, 5e-4, 2e-3)
    assert model.executor_only().step_time(StepShape((), (5, 6))) == pytest.approx(0.01)
    # A request's first prompt chunk pays its admission; a later chunk does not.
    assert model.step_time(StepShape(((8, 8),), ())) == pytest.approx(0.01 + 1.1e-4 + 5e-4)
    assert model.step_time(StepShape(((8, 16),), ())) == pytest.approx(0.01 + 1.1e-4)
    clock = VirtualClock()
    executor = SimulatedExecutor(model, clock, 100)
    builder = OutputBuilder(0)
    builder.add("a", 4, 1, True, num_prompt_tokens=5, new_request=_new("a", 5))
    builder.add("b", 4, 1, True, num_prompt_tokens=5, new_request=_new("b", 5))
    # The first step: price + engine time for 2 rows + the wake.
    assert executor.execute(builder.build()).step_duration == pytest.approx(0.01 + 1.2e-4 + 2e-3)
    builder = OutputBuilder(1)
    builder.add("a", 5, 1, True, num_prompt_tokens=5)
    # Back to back: no wake.
    assert executor.execute(builder.build()).step_duration == pytest.approx(0.01 + 1.1e-4)
    clock.advance(0.5)
    builder = OutputBuilder(2)
    builder.add("a", 6, 1, True, num_prompt_tokens=5)
    assert executor.execute(builder.build()).step_duration == pytest.approx(0.01 + 1.1e-4 + 2e-3)
    assert model.describe().endswith("engine time)")
