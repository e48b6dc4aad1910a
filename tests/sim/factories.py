"""Small builders for the simulator's tests."""

from __future__ import annotations

from dataclasses import dataclass

from heddle.core.outputs import ExecutorOutput, NewRequest, OutputBuilder, SchedulerOutput
from heddle.request import SamplingParams


@dataclass(frozen=True)
class Row:
    request_id: str
    num_new_tokens: int
    start_position: int
    sample: bool
    num_prompt_tokens: int
    num_output_tokens: int
    true_output_len: int | None
    eos_token_id: int | None
    stop_token_ids: tuple[int, ...]


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
) -> Row:
    context = start_position + num_new_tokens
    return Row(
        request_id,
        num_new_tokens,
        start_position,
        sample,
        context if num_prompt_tokens is None else num_prompt_tokens,
        num_output_tokens,
        true_output_len,
        eos_token_id,
        stop_token_ids,
    )


def step(*rows: Row, step_id: int = 0) -> SchedulerOutput:
    """A step in which every row is a request the executor sees for the first time."""
    builder = OutputBuilder(step_id)
    for row in rows:
        context = row.start_position + row.num_new_tokens
        known = max(row.num_prompt_tokens + row.num_output_tokens, context)
        new = NewRequest(
            row.request_id,
            [5] * known,
            row.num_prompt_tokens,
            list(range(-(-context // 16))),
            SamplingParams(stop_token_ids=row.stop_token_ids),
            row.eos_token_id,
            row.true_output_len,
        )
        builder.add(
            row.request_id,
            row.start_position,
            row.num_new_tokens,
            row.sample,
            num_prompt_tokens=row.num_prompt_tokens,
            new_request=new,
        )
    return builder.build()


def sampled(so: SchedulerOutput, out: ExecutorOutput) -> dict[str, list[int]]:
    """request id -> tokens sampled, for the rows that sampled."""
    return {
        rid: list(tokens)
        for rid, tokens in zip(so.request_ids, out.sampled_token_ids, strict=True)
        if tokens
    }
