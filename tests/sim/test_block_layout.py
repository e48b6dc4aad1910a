"""Block tables spread over the pool: counting their breaks, the profile's scattered tables,
the cost model's term for them and the simulator's use of it."""

from __future__ import annotations

import itertools
import random

import pytest

from heddle.clock import VirtualClock
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.errors import HeddleError
from heddle.model.profiling import build_scheduler_output, profile_executor, round_report
from heddle.model.profiling_layout import scatter_check, scatter_lines
from heddle.model.step_log import StepRecorder, shape_from_json, shape_to_json
from heddle.sim.block_layout import BlockBreaks, scattered_tables, table_breaks
from heddle.sim.cost_model import StepShape
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.profiled import ProfiledCostModel, fit_profile


def test_table_breaks_counts_blocks_that_do_not_follow_the_one_before():
    assert table_breaks([]) == 0
    assert table_breaks([7]) == 0
    assert table_breaks([3, 4, 5, 6]) == 0
    assert table_breaks([3, 4, 9, 10, 2]) == 2


def test_block_breaks_follows_new_tables_appended_blocks_and_departures():
    tracker = BlockBreaks()
    first = build_scheduler_output(StepShape(((8, 8),), (40, 40)), 0, 16, num_blocks=64,
                                   scatter=1.0)  # fmt: skip
    tables = {n.request_id: n.block_ids for n in first.new_requests}
    decodes = [r for r, n in zip(first.request_ids, first.num_new_tokens, strict=True) if n == 1]
    assert tracker.step(first) == sum(table_breaks(tables[r]) for r in decodes)
    # The chunk's request and one decode grow by a block: one follows its table, one jumps.
    chunk_id, (a, b) = first.request_ids[0], decodes
    so = SchedulerOutput(step_id=1, request_ids=[a, b], num_computed_tokens=[40, 40],
                         num_new_tokens=[1, 1], sample=[True, True], num_decode_rows=2,
                         decode_context_tokens=82, finished_request_ids=[chunk_id],
                         new_block_ids={a: [tables[a][-1] + 1], b: [10_000]})  # fmt: skip
    assert tracker.step(so) == table_breaks(tables[a]) + table_breaks(tables[b]) + 1
    assert len(tracker) == 2  # the chunk's request left
    done = SchedulerOutput(step_id=2, finished_request_ids=[a], preempted_request_ids=[b])
    assert tracker.step(done) == 0 and len(tracker) == 0


def test_scattered_tables_run_on_at_zero_and_jump_at_one():
    runs = scattered_tables([5, 3], 64, 0.0, random.Random(1))
    assert [table_breaks(t) for t in runs] == [0, 0]
    spread = scattered_tables([16, 16, 16], 64, 1.0, random.Random(1))
    blocks = [b for t in spread for b in t]
    assert len(set(blocks)) == 48 and all(0 <= b < 64 for b in blocks)
    assert sum(table_breaks(t) for t in spread) >= 35  # a random draw rarely runs on
    with pytest.raises(ValueError, match="scatter"):
        scattered_tables([2], 8, 1.5, random.Random(0))
    with pytest.raises(ValueError, match="pool of 8"):
        scattered_tables([5, 5], 8, 0.5, random.Random(0))
    with pytest.raises(HeddleError, match="num_blocks"):
        build_scheduler_output(StepShape((), (40,)), 0, 16, scatter=0.5)


def _fake_executor(clock: VirtualClock, per_break: float):
    """Charges 1 ms per token plus `per_break` per break of its decode rows' tables, counted
    from the tables it is sent (not with BlockBreaks)."""
    tables: dict[str, list[int]] = {}

    def execute(so: SchedulerOutput) -> ExecutorOutput:
        for new in so.new_requests:
            tables[new.request_id] = list(new.block_ids)
        for rid, ids in so.new_block_ids.items():
            tables[rid].extend(ids)
        breaks = sum(sum(1 for x, y in itertools.pairwise(t) if y != x + 1)
                     for rid, n in zip(so.request_ids, so.num_new_tokens, strict=True)
                     if n == 1 for t in [tables[rid]])  # fmt: skip
        clock.advance(0.001 * so.num_scheduled_tokens + per_break * breaks)
        return ExecutorOutput([[1] if s else [] for s in so.sample], 0.0)

    return execute


def test_profiled_breaks_are_fit_and_priced_by_the_simulator():
    clock = VirtualClock()
    rng = random.Random(3)
    shapes = [StepShape(((rng.randint(2, 64), 64),) * (i % 2), (rng.randint(20, 400),) * b)
              for i, b in enumerate([1, 2, 4, 8, 3, 6, 1, 5] * 4)]  # fmt: skip
    levels = [rng.random() for _ in shapes]
    samples = profile_executor(_fake_executor(clock, 2e-4), shapes, 16, repeats=1,
                               num_blocks=512, clock=clock, scatter=levels)  # fmt: skip
    assert sum(s.decode_block_breaks for s, _ in samples) > 50
    model = fit_profile(samples)
    assert model.coefficients["decode_block_breaks"] == pytest.approx(2e-4, rel=1e-3)
    assert model.reads_block_breaks
    # The simulator follows the tables it is sent and charges their breaks.
    sim_clock = VirtualClock()
    sim = SimulatedExecutor(model, sim_clock, vocab_size=100)
    recorder = StepRecorder(sim)
    spread = build_scheduler_output(StepShape((), (256,) * 4), 0, 16, 512, 100, scatter=1.0)
    breaks = sum(table_breaks(n.block_ids) for n in spread.new_requests)
    out = recorder.execute(spread)
    plain = model.step_time(StepShape((), (256,) * 4))
    assert out.step_duration == pytest.approx(plain + 2e-4 * breaks, rel=1e-6)
    assert recorder.steps[0][0].decode_block_breaks == breaks
    row = shape_to_json(recorder.steps[0][0])
    assert row["decode_breaks"] == breaks and shape_from_json(row) == recorder.steps[0][0]


def test_a_profile_without_the_term_leaves_the_simulator_loop_alone():
    model = ProfiledCostModel({"constant": 0.01, "decode_tokens": 0.001})
    assert not model.reads_block_breaks
    assert SimulatedExecutor(model, VirtualClock(), vocab_size=100)._breaks is None
    with pytest.raises(ValueError, match="decode_block_breaks"):
        StepShape(((8, 8),), (), decode_block_breaks=2)


def test_scatter_check_compares_measured_and_model_ratios_per_bucket():
    model = ProfiledCostModel({"constant": 0.01, "decode_block_breaks": 0.001})
    plain = StepShape((), (256,) * 4)
    pairs = [((plain, 0.010), (plain.with_breaks(5), 0.020))]
    check = scatter_check(model, pairs)
    (row,) = check["shapes"]
    assert row["measured_ratio"] == pytest.approx(2.0)
    assert row["model_ratio"] == pytest.approx(1.5)
    assert row["error_scattered"] == pytest.approx(-0.25)
    assert check["buckets"]["decode b=2-4 ctx<=256"]["model_ratio"] == pytest.approx(1.5)
    assert "measured 2.000, model 1.500" in "\n".join(scatter_lines(check))


def test_rounds_take_the_median_of_passes_and_report_each_pass():
    clock = VirtualClock()
    speed = [1.0]

    def execute(so: SchedulerOutput) -> ExecutorOutput:
        clock.advance(speed[0] * (0.002 + 0.001 * so.num_scheduled_tokens))
        return ExecutorOutput([[1] if s else [] for s in so.sample], 0.0)

    shapes = [StepShape((), (64,) * b) for b in range(1, 13)]
    passes: list[list[tuple[StepShape, float]]] = []

    class SlowSecondHalf:  # the machine slows down half-way through every pass
        calls = 0

        def __call__(self, so: SchedulerOutput) -> ExecutorOutput:
            self.calls += 1
            speed[0] = 1.0 if (self.calls // 2) % 12 < 6 else 1.3
            return execute(so)

    merged = profile_executor(SlowSecondHalf(), shapes, 16, repeats=1, clock=clock,
                              rounds=3, rounds_out=passes)  # fmt: skip
    assert len(passes) == 3 and [s for s, _ in merged] == shapes
    for i, (_, seconds) in enumerate(merged):
        assert seconds == pytest.approx(sorted(p[i][1] for p in passes)[1])
    report = round_report(passes, (), 0)
    assert report["rounds"] == 3 and len(report["fit_per_round"]) == 3
    with pytest.raises(HeddleError, match="rounds"):
        profile_executor(execute, shapes, 16, rounds=0)
    with pytest.raises(HeddleError, match="scatter levels"):
        profile_executor(execute, shapes, 16, scatter=[0.0])


def test_profile_model_prices_breaks_checks_them_and_reports_its_passes(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from heddle.cli.profile import layout_lines
    from heddle.model.profiling import profile_model

    clock = VirtualClock()
    fake = _fake_executor(clock, 3e-4)
    executor = SimpleNamespace(
        execute=fake, block_size=16, num_blocks=2048, model_name="fake", dtype="float32",
        model_shape=SimpleNamespace(vocab_size=100))  # fmt: skip
    import heddle.model.profiling as profiling
    import heddle.model.profiling_layout as layout

    real_profile_executor = profiling.profile_executor

    def on_the_fake_clock(*args, **kwargs):  # the profile's timings on the virtual clock
        return real_profile_executor(*args, **{**kwargs, "clock": clock})

    monkeypatch.setattr(profiling, "profile_executor", on_the_fake_clock)
    monkeypatch.setattr(layout, "profile_executor", on_the_fake_clock)
    model = profile_model(executor, max_num_batched_tokens=64, max_num_seqs=16,
                          max_context=512, num_mixed=16, repeats=1, rounds=2,
                          idle_gaps=None)  # fmt: skip
    assert model.coefficients["decode_block_breaks"] == pytest.approx(3e-4, rel=1e-3)
    check = model.metadata.extra["scatter"]
    assert check["shapes"] and all(r["breaks"] > 0 for r in check["shapes"])
    for b in check["buckets"].values():
        assert b["model_ratio"] == pytest.approx(b["measured_ratio"], rel=1e-3)
    assert model.metadata.extra["rounds"]["rounds"] == 2
    lines = "\n".join(layout_lines(model.metadata.extra))
    assert "scattered / runs" in lines and "2 passes" in lines
    model.save(tmp_path / "p.json")
    assert ProfiledCostModel.load(tmp_path / "p.json").reads_block_breaks
