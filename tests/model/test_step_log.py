"""Logging a real executor's steps, and the log's JSON."""

from __future__ import annotations

import json

import pytest

from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.errors import HeddleError
from heddle.model.profiling import build_scheduler_output
from heddle.model.step_log import StepRecorder, load_steps, save_steps
from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import features


class _Executor:
    block_size = 16

    def __init__(self) -> None:
        self.calls = 0

    def execute(self, so: SchedulerOutput) -> ExecutorOutput:
        self.calls += 1
        sampled = {
            rid: [1] for rid, sample in zip(so.request_ids, so.sample, strict=True) if sample
        }
        return ExecutorOutput(sampled, 0.001 * (so.num_scheduled_tokens + self.calls))


def test_recorder_logs_each_non_empty_step_with_the_executors_duration():
    inner = _Executor()
    recorder = StepRecorder(inner)
    shapes = [StepShape(((32, 100),), (5, 6)), StepShape((), (7,)), StepShape(((4, 4),), ())]
    outputs = [recorder.execute(build_scheduler_output(s, i, 16)) for i, s in enumerate(shapes)]
    recorder.execute(SchedulerOutput(step_id=9))
    assert recorder.steps == [(s, o.step_duration) for s, o in zip(shapes, outputs, strict=True)]
    assert [t for _, t in recorder.steps] == pytest.approx([0.035, 0.003, 0.007])
    assert recorder.block_size == 16 and inner.calls == 4  # the rest is the executor's


def test_log_round_trip_keeps_what_a_cost_model_reads(tmp_path):
    steps = [(StepShape(((32, 100), (8, 8)), (5, 6, 20), num_sampled=4), 0.02),
             (StepShape((), (3,)), 0.001)]  # fmt: skip
    path = tmp_path / "run.json"
    save_steps(path, steps, {"dtype": "bfloat16"})
    loaded, metadata = load_steps(path)
    assert metadata == {"dtype": "bfloat16"}
    assert [t for _, t in loaded] == [0.02, 0.001]
    for (shape, _), (again, _) in zip(steps, loaded, strict=True):
        assert features(again) == features(shape)
        assert again.decode_context_tokens == shape.decode_context_tokens


def test_bad_logs_are_clear_errors(tmp_path):
    path = tmp_path / "x.json"
    with pytest.raises(HeddleError, match="cannot read step log"):
        load_steps(path)
    path.write_text(json.dumps({"format": "heddle-step-profile/1"}))
    with pytest.raises(HeddleError, match="not a heddle step log"):
        load_steps(path)
    path.write_text(json.dumps({"format": "heddle-step-log/1", "steps": [{"decode": 2}]}))
    with pytest.raises(HeddleError, match="malformed step row"):
        load_steps(path)


def test_recorder_keeps_the_idle_gap_before_each_step_and_the_log_keeps_it(tmp_path):
    import time

    from heddle.model.step_log import load_step_gaps

    recorder = StepRecorder(_Executor())
    recorder.execute(build_scheduler_output(StepShape((), (7,)), 0, 16))
    recorder.execute(SchedulerOutput(step_id=1))  # an empty step: not a step, not a gap
    time.sleep(0.02)
    recorder.execute(build_scheduler_output(StepShape((), (8,)), 2, 16))
    assert len(recorder.gaps) == 2 and recorder.gaps[0] is None
    assert 0.02 <= recorder.gaps[1] < 1.0
    path = tmp_path / "run.json"
    save_steps(path, recorder.steps, {}, gaps=recorder.gaps)
    assert load_step_gaps(path) == recorder.gaps
    save_steps(path, recorder.steps)
    assert load_step_gaps(path) == [None, None]
    with pytest.raises(ValueError, match="1 gaps for 2 steps"):
        save_steps(path, recorder.steps, gaps=[0.1])
