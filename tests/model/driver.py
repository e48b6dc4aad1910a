"""A test-local stand-in for the scheduler: builds SchedulerOutputs by hand.

Requests arrive one per step, so prefill chunks (up to `chunk_size` tokens) run in the same
steps as other requests' decodes. Blocks come from a free list; a finished request returns
them. The real scheduler lives in heddle/core; this only exercises the executor contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams


@dataclass
class DriverRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    num_blocks_sent: int = 0
    sent: bool = False

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def done(self) -> bool:
        return self.num_output >= self.max_new_tokens


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        # Hand blocks out in a scrambled order, so block tables are not contiguous ranges.
        self.free = [b for b in range(num_blocks) if b % 2 == 1] + [
            b for b in range(num_blocks) if b % 2 == 0
        ]

    def grow(self, request: DriverRequest, num_tokens: int, block_size: int) -> None:
        needed = (num_tokens + block_size - 1) // block_size
        while len(request.blocks) < needed:
            request.blocks.append(self.free.pop())

    def release(self, request: DriverRequest) -> None:
        self.free.extend(request.blocks)
        request.blocks = []


def generate(
    executor: ModelExecutor,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    chunk_size: int = 16,
    arrivals_per_step: int = 1,
) -> list[list[int]]:
    """Run all prompts as one continuous batch; return each request's new tokens."""
    params = params or SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    allocator = BlockAllocator(executor.num_blocks)
    waiting = [
        DriverRequest(f"req-{i}", prompt, params, max_new_tokens)
        for i, prompt in enumerate(prompts)
    ]
    running: list[DriverRequest] = []
    finished: list[str] = []
    step_id = 0
    all_requests = list(waiting)
    while waiting or running:
        running.extend(waiting[:arrivals_per_step])
        del waiting[:arrivals_per_step]
        builder = OutputBuilder(step_id)
        for request in running:
            remaining = len(request.tokens) - request.num_computed
            num_new = min(remaining, chunk_size)
            end = request.num_computed + num_new
            allocator.grow(request, end, executor.block_size)
            new = None
            if not request.sent:
                new = NewRequest(request.request_id, list(request.tokens), len(request.prompt),
                                 list(request.blocks), request.params)
                request.sent = True
                added = None
            else:
                added = request.blocks[request.num_blocks_sent:]
            request.num_blocks_sent = len(request.blocks)
            builder.add(request.request_id, request.num_computed, num_new,
                        end == len(request.tokens), num_prompt_tokens=len(request.prompt),
                        new_request=new, new_block_ids=added)
        step = builder.build(finished_request_ids=finished)
        output = executor.execute(step)
        finished = []
        step_id += 1
        for request, num_new, sample, tokens in zip(
            running, step.num_new_tokens, step.sample, output.sampled_token_ids, strict=True
        ):
            request.num_computed += num_new
            if sample:
                assert len(tokens) == 1
                request.tokens.extend(tokens)
            else:
                assert not tokens
        for request in [r for r in running if r.done]:
            running.remove(request)
            allocator.release(request)
            finished.append(request.request_id)
    return [r.tokens[len(r.prompt):] for r in all_requests]
