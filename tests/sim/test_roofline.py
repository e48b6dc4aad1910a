"""The roofline cost model: physical sanity, monotonicity, KV pool sizing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.errors import HeddleError
from heddle.sim.cost_model import StepShape
from heddle.sim.roofline import RooflineCostModel, kv_cache_blocks
from heddle.sim.specs import HardwareSpec, load_hardware_spec, load_model_spec

H100 = load_hardware_spec("h100")
LLAMA_8B = load_model_spec("llama-3.1-8b")


def test_decode_at_batch_one_is_a_weight_read():
    model = RooflineCostModel(LLAMA_8B, H100)
    times = model.operator_times(StepShape((), (256,)))
    # Every weight but the embedding table (which only a lookup touches) is read once.
    embedding_bytes = LLAMA_8B.vocab_size * LLAMA_8B.hidden_size * LLAMA_8B.dtype_bytes
    read_bytes = LLAMA_8B.weight_bytes() - embedding_bytes
    weight_read = read_bytes / (H100.memory_bandwidth * H100.memory_efficiency)
    assert sum(times.values()) - H100.step_overhead == pytest.approx(weight_read, rel=0.01)
    for name in ("qkv_proj", "o_proj", "mlp_up_gate", "mlp_down"):
        assert times[name] > 10 * (times["attn_decode"] / 4)  # weights dominate a short context


def test_large_prefill_is_compute_bound():
    model = RooflineCostModel(LLAMA_8B, H100)
    shape = StepShape(((8192, 8192),), (), num_sampled=1)
    flops_per_s = H100.peak_flops["bfloat16"] * H100.compute_efficiency
    linear_flops = 2 * 8192 * LLAMA_8B.num_layers * LLAMA_8B.layer_params()
    times = model.operator_times(shape)
    linears = sum(times[n] for n in ("qkv_proj", "o_proj", "mlp_up_gate", "mlp_down"))
    assert linears == pytest.approx(linear_flops / flops_per_s, rel=0.01)
    # Causal attention over 8k tokens: 4 * pairs * heads * head_dim FLOPs per layer.
    pairs = 8192 * 8193 // 2
    attention_flops = 4 * pairs * 32 * 128 * 32
    assert times["attn_prefill"] == pytest.approx(attention_flops / flops_per_s, rel=1e-9)


def test_lm_head_only_for_sampled_rows():
    model = RooflineCostModel(LLAMA_8B, H100)
    quiet = model.operator_times(StepShape(((512, 512),), (), num_sampled=0))
    sampled = model.operator_times(StepShape(((512, 512),), (), num_sampled=1))
    assert quiet["lm_head"] == 0.0
    assert sampled["lm_head"] > 0.0
    assert {k: v for k, v in quiet.items() if k != "lm_head"} == {
        k: v for k, v in sampled.items() if k != "lm_head"
    }


def test_tensor_parallel_splits_work_and_adds_all_reduce():
    model = load_model_spec("llama-3.1-70b")
    shape = StepShape((), (1024,) * 16)
    tp4 = RooflineCostModel(model, H100, tp=4).operator_times(shape)
    tp8 = RooflineCostModel(model, H100, tp=8).operator_times(shape)
    assert tp8["mlp_up_gate"] < tp4["mlp_up_gate"]
    assert tp4["tp_all_reduce"] > 0
    assert RooflineCostModel(model, H100).tp == 4  # the spec's default
    assert RooflineCostModel(LLAMA_8B, H100).operator_times(shape)["tp_all_reduce"] == 0.0
    with pytest.raises(HeddleError, match="tp=3"):
        RooflineCostModel(model, H100, tp=3)


def test_dtype_override_changes_the_peak_and_the_bytes():
    # A machine whose fp32 peak is 10x its bf16 one (an old CPU without native bf16).
    hw = HardwareSpec(
        name="no-bf16", peak_flops={"float32": 1e12, "bfloat16": 1e11}, memory_bandwidth=1e10,
        memory_bytes=1e10,
    )  # fmt: skip
    fp32 = RooflineCostModel("smollm2-135m", hw, dtype="float32")
    bf16 = RooflineCostModel("smollm2-135m", hw)
    prefill = StepShape(((256, 256),), (), num_sampled=1)  # compute-bound: the peak decides
    assert fp32.step_time(prefill) < bf16.step_time(prefill)
    decode = StepShape((), (128,))  # memory-bound: bf16 reads half the bytes
    assert bf16.step_time(decode) < fp32.step_time(decode)
    with pytest.raises(HeddleError, match="unknown dtype"):
        RooflineCostModel("smollm2-135m", "cpu-2core", dtype="int4")


def test_empty_step_costs_nothing():
    assert RooflineCostModel(LLAMA_8B, H100).step_time(StepShape()) == 0.0


contexts = st.integers(min_value=1, max_value=32768)
chunks = st.tuples(st.integers(2, 4096), st.integers(0, 16384)).map(lambda c: (c[0], c[0] + c[1]))
shapes = st.builds(
    lambda p, d: StepShape(tuple(p), tuple(d)),
    st.lists(chunks, max_size=4),
    st.lists(contexts, max_size=64),
)
models = st.sampled_from(
    [
        RooflineCostModel("llama-3.1-8b", "h100"),
        RooflineCostModel("qwen2.5-7b", "a100"),
        RooflineCostModel("llama-3.1-70b", "h200", tp=8),
        RooflineCostModel("smollm2-135m", "cpu-2core", dtype="float32"),
    ]
)


@settings(max_examples=150, deadline=None)
@given(models, shapes, contexts)
def test_adding_a_decode_request_never_makes_a_step_faster(model, shape, context):
    bigger = StepShape(shape.prefill_chunks, (*shape.decode_context_lens, context))
    assert model.step_time(bigger) >= model.step_time(shape)


@settings(max_examples=150, deadline=None)
@given(models, shapes, st.integers(1, 8192))
def test_longer_contexts_never_make_a_step_faster(model, shape, extra):
    longer = StepShape(
        tuple((n, c + extra) for n, c in shape.prefill_chunks),
        tuple(c + extra for c in shape.decode_context_lens),
    )
    assert model.step_time(longer) >= model.step_time(shape)


def test_kv_cache_blocks_follow_from_memory_left_after_weights():
    blocks = kv_cache_blocks("llama-3.1-8b", "h100", block_size=16)
    block_bytes = 16 * LLAMA_8B.kv_bytes_per_token()
    free = H100.memory_bytes * 0.9 - LLAMA_8B.weight_bytes()
    assert 0.9 * free < blocks * block_bytes <= free  # the activation reserve is a few percent
    assert kv_cache_blocks("llama-3.1-8b", "h200", block_size=16) > 1.9 * blocks
    assert kv_cache_blocks("llama-3.1-8b", "h100", 16, gpu_memory_utilization=0.5) < blocks
    # tp=2 halves both the weights and each block's KV heads per device.
    assert kv_cache_blocks("llama-3.1-8b", "h100", 16, tp=2) > 2 * blocks


def test_a_model_that_does_not_fit_says_so():
    with pytest.raises(HeddleError, match=r"does not fit on h100 with tp=1.*raise tp"):
        kv_cache_blocks("llama-3.1-70b", "h100", block_size=16)
    assert kv_cache_blocks("llama-3.1-70b", "h100", block_size=16, tp=4) > 10_000
