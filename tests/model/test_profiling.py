"""Profiling a real executor: the grid, synthetic scheduler outputs, timing."""

from __future__ import annotations

import itertools

import pytest

from heddle.clock import VirtualClock
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.errors import HeddleError
from heddle.model.profiling import (
    build_scheduler_output,
    profile_executor,
    profile_grid,
    profile_shapes,
)
from heddle.sim.cost_model import StepShape


def test_grid_respects_the_limits_and_covers_each_kind():
    shapes = profile_grid(max_num_batched_tokens=256, max_num_seqs=16, max_context=2048)
    assert len(set(shapes)) == len(shapes)
    assert all(s.num_tokens <= 256 and s.num_requests <= 17 for s in shapes)
    assert all(c <= 2048 for s in shapes for _, c in s.prefill_chunks)
    assert all(c <= 2048 for s in shapes for c in s.decode_context_lens)
    assert any(s.prefill_chunks and not s.decode_context_lens for s in shapes)
    assert any(s.decode_context_lens and not s.prefill_chunks for s in shapes)
    assert any(s.decode_context_lens and s.prefill_chunks for s in shapes)
    small = profile_grid(256, 16, 2048, max_kv_tokens=1024)
    assert small and all(
        sum(c for _, c in s.prefill_chunks) + s.decode_context_tokens <= 1024 for s in small
    )


@pytest.mark.parametrize(
    "shape",
    [
        StepShape(((64, 64),), (), num_sampled=1),
        StepShape(((32, 100), (16, 16)), (1, 17, 33), num_sampled=4),
        StepShape(((32, 100),), (5, 6)),
        StepShape((), (1, 2, 3), num_sampled=2),
    ],
)
def test_scheduler_output_has_the_requested_shape(shape):
    so = build_scheduler_output(shape, step_id=7, block_size=16, vocab_size=100)
    assert StepShape.from_scheduler_output(so) == shape
    assert [n.request_id for n in so.new_requests] == so.request_ids  # all new to the executor
    blocks = [b for n in so.new_requests for b in n.block_ids]
    assert blocks == list(range(len(blocks)))  # fresh, distinct blocks
    for s, new in zip(so.rows(), so.new_requests, strict=True):
        table = new.block_ids
        assert len(table) * 16 >= s.context_len > (len(table) - 1) * 16
        assert all(0 < t < 100 for t in new.token_ids)
        assert new.sampling_params.temperature == 0.0
        # A row samples exactly when it computes through the end of its known tokens; no row
        # computes past them, and a row that does not sample stops short of its prompt's end.
        known = len(new.token_ids)
        assert s.context_len <= known
        assert s.sample == (s.context_len == known)
        if not s.sample:
            assert s.context_len < new.num_prompt_tokens


def test_too_many_blocks_is_an_error():
    with pytest.raises(HeddleError, match=r"needs 64 KV blocks.*has 10"):
        build_scheduler_output(StepShape((), (16,) * 64), 0, block_size=16, num_blocks=10)


def test_profile_executor_times_each_shape_and_releases_requests():
    clock = VirtualClock()
    seen: list[SchedulerOutput] = []

    def execute(so: SchedulerOutput) -> ExecutorOutput:
        seen.append(so)
        clock.advance(0.001 * so.num_scheduled_tokens)
        return ExecutorOutput([[1] if sample else [] for sample in so.sample], 0.0)

    shapes = [StepShape(((8, 8),), (10,) * 4, num_sampled=5), StepShape(((8, 8),), (),
                                                                        num_sampled=1)]
    samples = profile_executor(execute, shapes, block_size=4, repeats=3, warmup=2, clock=clock)
    assert samples == [(shapes[0], pytest.approx(0.012)), (shapes[1], pytest.approx(0.008))]
    assert len(seen) == 2 * 5
    assert seen[0].finished_request_ids == []
    # A shape's first run sends every row new; its later runs schedule the same decodes again
    # as known requests (a running engine's decodes are), each one position further on (the
    # last run is the shape), and a new prompt chunk each time.
    first = seen[0]
    assert StepShape.from_scheduler_output(seen[4]) == shapes[0]
    for k, run in enumerate(seen[:5]):
        assert [c for c, n in zip(run.num_computed_tokens, run.num_new_tokens, strict=True)
                if n == 1] == [5 + k] * 4  # fmt: skip
    for run in seen[1:5]:
        decodes = [r for r, n in zip(run.request_ids, run.num_new_tokens, strict=True) if n == 1]
        assert decodes == [r for r, n in zip(first.request_ids, first.num_new_tokens,
                                             strict=True) if n == 1]  # fmt: skip
        assert [n.request_id for n in run.new_requests] == [run.request_ids[0]]
    for before, after in itertools.pairwise(seen):
        # Each run's chunk is released after it; the decodes when the shape is done.
        last_of_shape = after is seen[5]
        chunks = [r for r, n in zip(before.request_ids, before.num_new_tokens, strict=True)
                  if n > 1 or last_of_shape]  # fmt: skip
        assert after.finished_request_ids == chunks
    assert not set(seen[5].request_ids) & set(seen[4].request_ids)


def test_mixed_shapes_look_like_a_running_engines_steps():
    shapes = profile_shapes(256, 32, 1024, max_kv_tokens=8000, num_shapes=90, seed=3)
    assert len(shapes) == 90 and shapes == profile_shapes(
        256, 32, 1024, 8000, num_shapes=90, seed=3
    )
    assert all(s.num_tokens <= 256 and s.num_decode_tokens <= 32 for s in shapes)
    assert all(
        sum(c for _, c in s.prefill_chunks) + s.decode_context_tokens <= 8000 for s in shapes
    )
    mixed = [s for s in shapes if s.prefill_chunks and s.decode_context_lens]
    assert len(mixed) > 20
    assert any(len(s.prefill_chunks) > 1 for s in mixed)  # several new requests in one step
    # A quarter are a light load's first steps: one new prompt of 2-64 tokens beside 0-16
    # short decodes (the steps a chat request's first token comes from).
    light = [s for s in shapes[3::4]]
    assert all(len(s.prefill_chunks) == 1 and s.prefill_chunks[0][0] <= 64
               and s.prefill_chunks[0][0] == s.prefill_chunks[0][1]
               and s.num_decode_tokens <= 16
               and all(16 <= c <= 512 for c in s.decode_context_lens) for s in light)  # fmt: skip
    assert any(s.num_decode_tokens for s in light) and any(not s.num_decode_tokens for s in light)
    assert any(s.num_tokens == 256 for s in mixed) and any(s.num_tokens < 64 for s in mixed)
    # Decode contexts of one step differ (the grid's are all equal).
    assert any(len(set(s.decode_context_lens)) > 1 for s in shapes)
    for shape in shapes:
        so = build_scheduler_output(shape, step_id=0, block_size=16, vocab_size=100)
        assert StepShape.from_scheduler_output(so) == shape


@pytest.mark.parametrize("mode", ["known", "new"])
def test_profile_executor_can_rerun_a_position_or_send_decodes_new(mode):
    seen: list[SchedulerOutput] = []

    def execute(so: SchedulerOutput) -> ExecutorOutput:
        seen.append(so)
        return ExecutorOutput([[1] if sample else [] for sample in so.sample], 0.0)

    shape = StepShape(((8, 8),), (10, 3), num_sampled=2)
    profile_executor(execute, [shape], block_size=4, repeats=3, decode_runs=mode,
                     clock=VirtualClock())  # fmt: skip
    assert all(StepShape.from_scheduler_output(so) == shape for so in seen)
    new_decodes = [sum(1 for n in so.new_requests if n.request_id in so.request_ids[1:])
                   for so in seen]  # fmt: skip
    assert new_decodes == ([2, 0, 0, 0] if mode == "known" else [2, 2, 2, 2])
    if mode == "new":  # each run's decodes are released before the next run
        for before, after in itertools.pairwise(seen):
            assert after.finished_request_ids == before.request_ids
    with pytest.raises(HeddleError, match="decode_runs"):
        profile_executor(execute, [shape], block_size=4, decode_runs="same")


def test_moving_decodes_run_on_the_real_executor_at_advancing_positions(smol_executor):
    """On the real executor the moving runs are valid steps: each decode's next position is a
    token the executor knows (its prompt, or what it sampled), the blocks cover the shape
    (the executor checks both and raises otherwise)."""
    executor = smol_executor
    # a decode at context 2 (it cannot lag 3), two sampling ones, one mid-prompt, a chunk
    shapes = [StepShape(((5, 21),), (2, 19, 40), num_sampled=2)]
    samples = profile_executor(executor.execute, shapes, executor.block_size, repeats=3,
                               num_blocks=executor.num_blocks,
                               vocab_size=executor.model_shape.vocab_size)  # fmt: skip
    assert [s for s, _ in samples] == shapes and all(t > 0 for _, t in samples)
