"""One step being built: its token budget (per lane) and the rows granted so far.

Each row granted is written straight into the output's columns, with the step's totals
(prefill and decode tokens, context lengths, ...) kept up to date, so the `SchedulerOutput` is
ready when granting ends: one pass over the step's requests, not two. A request the executor
has not seen gets a `NewRequest`; one it knows gets only the blocks appended to its table since
it last ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heddle.core.outputs import NewRequest, SchedulerOutput

if TYPE_CHECKING:
    from heddle.core.kv_cache import KVCacheManager
    from heddle.request import Request


class StepBuilder:
    __slots__ = (
        "block_size",
        "kv",
        "lane_left",
        "long_prefill_threshold",
        "output",
        "requests",
        "tokens_left",
    )

    def __init__(
        self,
        token_budget: int,
        lane_budgets: dict[str, int],
        threshold: int | None,
        kv: KVCacheManager,
        step_id: int,
    ) -> None:
        self.tokens_left = token_budget
        self.lane_left = dict(lane_budgets)
        self.long_prefill_threshold = threshold
        self.kv = kv
        self.block_size = kv.block_size
        self.output = SchedulerOutput(step_id=step_id)
        self.requests: list[Request] = []  # the rows' requests, parallel to the columns

    def grant(self, lane: str, wanted: int) -> int:
        """How many of `wanted` tokens fit now."""
        num = min(wanted, self.tokens_left)
        if self.long_prefill_threshold is not None:
            num = min(num, self.long_prefill_threshold)
        if lane in self.lane_left:
            num = min(num, self.lane_left[lane])
        return num

    def take(
        self, request: Request, lane: str, num: int, drafts: list[int] | None = None
    ) -> None:
        """Grant `num` tokens to `request` (its blocks already cover them): add its row.
        `drafts`: the last len(drafts) of the `num` are draft tokens (speculative decoding)."""
        self.tokens_left -= num
        if lane in self.lane_left:
            self.lane_left[lane] -= num
        self.add_row(request, num, drafts)

    def add_row(self, request: Request, num: int, drafts: list[int] | None = None) -> None:
        """The row of `request` computing `num` tokens, with the totals and what the executor
        needs to know of it (the scheduler's decode fast path calls this directly)."""
        self.requests.append(request)
        so = self.output
        request_id = request.request_id
        start = request.num_computed_tokens
        end = start + num
        so.request_ids.append(request_id)
        so.num_computed_tokens.append(start)
        so.num_new_tokens.append(num)
        if drafts:
            so.draft_token_ids[request_id] = drafts
            end -= len(drafts)
        samples = end == len(request.all_token_ids)
        if drafts:
            end += len(drafts)
        so.sample.append(samples)
        if samples:
            # A verify row computes logits at its known token and at each draft: k + 1 rows
            # through the LM head (what a cost model prices).
            so.num_sampled += 1 + len(drafts) if drafts else 1
        so.num_scheduled_tokens += num
        if start < request.num_prompt_tokens:
            so.num_prefill_tokens += num
        else:
            so.num_decode_tokens += num
        if num == 1:
            so.num_decode_rows += 1
            so.decode_context_tokens += end
        else:
            so.prefill_chunks.append((num, end))
        if end > so.longest_context:
            so.longest_context = end
        if not request.known_to_executor or request.num_slots != request.num_slots_sent:
            self.tell_executor(request)

    def add_decode_totals(
        self, num_rows: int, context_tokens: int, num_in_prompt: int, longest: int
    ) -> None:
        """The totals of `num_rows` one-token sampling rows whose columns the scheduler's
        decode fast path appended itself (`num_in_prompt` of them start inside the prompt)."""
        so = self.output
        so.num_scheduled_tokens += num_rows
        so.num_sampled += num_rows
        so.num_prefill_tokens += num_in_prompt
        so.num_decode_tokens += num_rows - num_in_prompt
        so.num_decode_rows += num_rows
        so.decode_context_tokens += context_tokens
        if longest > so.longest_context:
            so.longest_context = longest

    def tell_executor(self, request: Request) -> None:
        """What the executor does not know yet of a request in the step: all of it (a new or
        resumed request), or the blocks appended to its table since it last ran."""
        so = self.output
        request_id = request.request_id
        if not request.known_to_executor:
            so.new_requests.append(
                NewRequest(
                    request_id,
                    list(request.all_token_ids),
                    request.num_prompt_tokens,
                    list(self.kv.block_ids(request_id)),
                    request.sampling_params,
                    request.eos_token_id,
                    request.true_output_len,
                )
            )
            request.known_to_executor = True
            request.num_slots_sent = request.num_slots
        elif request.num_slots != request.num_slots_sent:
            table = self.kv.block_ids(request_id)
            so.new_block_ids[request_id] = table[request.num_slots_sent // self.block_size :]
            request.num_slots_sent = request.num_slots

    def release(self, request: Request, lane: str) -> None:
        """Take back `request`'s row (it is preempted after all) and rebuild the others' (rare:
        a waiting request evicting one that was already served this step)."""
        if request not in self.requests:
            return
        so = self.output
        index = self.requests.index(request)
        self.tokens_left += so.num_new_tokens[index]
        if lane in self.lane_left:
            self.lane_left[lane] += so.num_new_tokens[index]
        kept = [
            (r, n)
            for i, (r, n) in enumerate(zip(self.requests, so.num_new_tokens, strict=True))
            if i != index
        ]
        drafts = so.draft_token_ids
        # Undo what the rows told the executor, then add them again.
        new_ids = {new.request_id for new in so.new_requests}
        for r in self.requests:
            if r.request_id in new_ids:
                r.known_to_executor = False
            elif r.request_id in so.new_block_ids:
                r.num_slots_sent -= len(so.new_block_ids[r.request_id]) * self.block_size
        self.output = SchedulerOutput(step_id=so.step_id)
        self.requests = []
        for r, n in kept:
            self.add_row(r, n, drafts.get(r.request_id))
