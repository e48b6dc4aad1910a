"""Small builders for the simulator's tests."""

from __future__ import annotations

from heddle.core.outputs import ScheduledRequest, SchedulerOutput
from heddle.request import SamplingParams


def scheduled(
    request_id: str = "r",
    num_new_tokens: int = 1,
    start_position: int = 0,
    *,
    sample: bool = True,
    num_prompt_tokens: int | None = None,
    num_output_tokens: int = 0,
    true_output_len: int | None = None,
    eos_token_id: int | None = None,
    stop_token_ids: tuple[int, ...] = (),
) -> ScheduledRequest:
    context = start_position + num_new_tokens
    return ScheduledRequest(
        request_id=request_id,
        token_ids=[5] * num_new_tokens,
        start_position=start_position,
        block_table=list(range(-(-context // 16))),
        sample=sample,
        sampling_params=SamplingParams(stop_token_ids=stop_token_ids),
        num_prompt_tokens=context if num_prompt_tokens is None else num_prompt_tokens,
        num_output_tokens=num_output_tokens,
        true_output_len=true_output_len,
        eos_token_id=eos_token_id,
    )


def step(*requests: ScheduledRequest, step_id: int = 0) -> SchedulerOutput:
    return SchedulerOutput(step_id=step_id, scheduled=list(requests))
