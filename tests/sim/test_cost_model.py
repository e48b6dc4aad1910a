"""StepShape: what a cost model sees of a step; the cost-model registry."""

from __future__ import annotations

import pytest

from heddle.errors import HeddleError
from heddle.sim.cost_model import StepShape
from heddle.sim.registry import ConstantCostModel, cost_model_names, make_cost_model
from heddle.sim.roofline import RooflineCostModel
from tests.sim.factories import scheduled, step


def test_from_scheduler_output_splits_chunks_from_single_tokens():
    so = step(
        scheduled("a", num_new_tokens=64, start_position=128, sample=False, num_prompt_tokens=300),
        scheduled("b", num_new_tokens=1, start_position=40, num_prompt_tokens=30),
        scheduled("c", num_new_tokens=8, start_position=0, sample=True),
        scheduled("d", num_new_tokens=1, start_position=9, num_prompt_tokens=5),
    )
    shape = StepShape.from_scheduler_output(so)
    assert shape.prefill_chunks == ((64, 192), (8, 8))
    assert shape.num_decode_tokens == 2 and shape.decode_context_tokens == 41 + 10
    assert shape.num_sampled == 3
    assert shape.num_prefill_tokens == 72
    assert shape.num_decode_tokens == 2
    assert shape.num_tokens == so.num_scheduled_tokens == 74
    assert shape.num_requests == 4
    assert shape.decode_context_tokens == 51
    # a: 64 queries after 128 cached keys; c: 8 causal queries from scratch.
    assert shape.prefill_attention_pairs == 64 * 128 + 64 * 65 // 2 + 8 * 9 // 2


def test_num_sampled_defaults_to_one_per_decode():
    assert StepShape(((16, 16),), (5, 6, 7)).num_sampled_rows == 3
    assert StepShape(((16, 16),), (5, 6, 7), num_sampled=4).num_sampled_rows == 4
    assert StepShape().is_empty


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefill_chunks": ((1, 5),)},  # one token is a decode
        {"prefill_chunks": ((8, 4),)},  # context shorter than the chunk
        {"decode_context_lens": (0,)},
        {"decode_context_lens": (3,), "num_sampled": 2},
    ],
)
def test_invalid_shapes_are_rejected(kwargs):
    with pytest.raises(ValueError):
        StepShape(**kwargs)


def test_registry_builds_models_by_name():
    assert cost_model_names() == ["constant", "profiled", "roofline"]
    roofline = make_cost_model("Roofline", model="llama-3.1-8b", hardware="h100")
    assert isinstance(roofline, RooflineCostModel)
    assert roofline.describe() == "roofline(llama-3.1-8b bfloat16, h100, tp=1)"
    constant = make_cost_model("constant", seconds=0.5)
    assert isinstance(constant, ConstantCostModel)
    assert constant.step_time(StepShape((), (3,))) == 0.5
    assert constant.step_time(StepShape()) == 0.0


def test_registry_errors_name_the_choices():
    with pytest.raises(HeddleError, match="known are constant, profiled, roofline"):
        make_cost_model("vidur")
    with pytest.raises(HeddleError, match="bad options"):
        make_cost_model("roofline", model="llama-3.1-8b")
