"""ReasoningState: phases, budgets, forced closes, and agreement with the text parser.

The agreement test is the one that llama.cpp #28182 and vLLM #43757 lacked: for random token
streams (markers anywhere, the budget cutting blocks, blocks re-entered after the budget is
spent), the tokens the engine counted as thinking are exactly the words the parser shows as
reasoning, and the answer holds exactly the answer tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.errors import InvalidRequestError, ModelLoadError
from heddle.reasoning import Phase, ReasoningFormat, ReasoningState, thinking_budget

START_ID, END_ID = 1, 2
FMT = ReasoningFormat(START_ID, END_ID)


def run(state: ReasoningState, model_tokens: list[int]) -> list[int]:
    """Feed what a model samples; forced tokens are appended and observed like sampled ones."""
    output: list[int] = []
    for token in model_tokens:
        output.append(token)
        forced = state.observe(token)
        while forced is not None:
            output.append(forced)
            forced = state.observe(forced)
    return output


def test_model_opened_block_without_budget():
    state = FMT.new_state([7, 8], budget=None)
    assert state.phase is Phase.ANSWERING
    assert run(state, [START_ID, 10, 11, END_ID, 12]) == [START_ID, 10, 11, END_ID, 12]
    assert (state.num_thinking_tokens, state.num_answer_tokens, state.num_blocks) == (2, 1, 1)
    assert state.phase is Phase.ANSWERING and state.num_forced == 0


def test_budget_closes_a_template_opened_block():
    state = FMT.new_state([7, START_ID], budget=3)
    assert state.is_thinking and state.thinking_tokens_left == 3
    out = run(state, [10, 11, 12, 13, 14])
    # The 3rd thinking token forces </think>; 13 and 14 are answer tokens.
    assert out == [10, 11, 12, END_ID, 13, 14]
    assert state.num_thinking_tokens == 3 and state.num_forced == 1
    assert state.phase is Phase.ANSWERING and state.tokens_in_phase == 2


def test_budget_zero_on_a_model_opened_block_closes_it_at_once():
    state = FMT.new_state([7], budget=0)
    assert run(state, [START_ID, 10]) == [START_ID, END_ID, 10]
    assert state.num_thinking_tokens == 0


def test_budget_zero_on_a_prompt_opened_block_closes_it_in_the_prompt():
    prompt, thinking = FMT.prepare_prompt([7, START_ID], budget=0)
    assert prompt == [7, START_ID, END_ID] and not thinking
    assert FMT.new_state(prompt, 0).phase is Phase.ANSWERING
    assert FMT.prepare_prompt([7, START_ID], budget=5) == ([7, START_ID], True)


def test_reentry_after_the_budget_is_spent_is_closed_at_once():
    state = FMT.new_state([START_ID], budget=2)
    out = run(state, [10, 11, 12, START_ID, 13, 14])
    assert out == [10, 11, END_ID, 12, START_ID, END_ID, 13, 14]
    assert state.num_thinking_tokens == 2 and state.num_forced == 2 and state.num_blocks == 2


def test_earlier_turns_do_not_open_a_block():
    # A closed block of an earlier turn, then the new turn's prompt without a marker.
    assert not FMT.starts_in_thinking([START_ID, 5, END_ID, 6, 7])
    assert FMT.starts_in_thinking([START_ID, 5, END_ID, 6, START_ID, 9])


def test_simulated_phase_turns_at_the_true_thinking_length():
    state = ReasoningState(phase=Phase.THINKING, true_thinking_len=3)
    for _ in range(3):
        assert state.is_thinking
        state.observe(0)
    assert state.phase is Phase.ANSWERING
    state.observe(0)
    assert (state.num_thinking_tokens, state.num_answer_tokens) == (3, 1)


def test_budget_mapping():
    assert thinking_budget(None, None, 100) is None
    assert thinking_budget(None, "low", None) == 1024
    assert thinking_budget(None, "high", 30000) == 24576
    assert thinking_budget(None, "medium", 1000) == 998  # room for </think> and one answer token
    assert thinking_budget(50, "high", None) == 50  # an explicit count wins
    assert thinking_budget(None, "none", None) == 0
    assert thinking_budget(10, None, 1) == 0
    with pytest.raises(InvalidRequestError, match="reasoning_effort"):
        thinking_budget(None, "extreme", None)
    with pytest.raises(InvalidRequestError, match="max_thinking_tokens"):
        thinking_budget(-1, None, None)


class _Vocab:
    def __init__(self, ids: dict[str, int], special: list[int]) -> None:
        self.ids, self.all_special_ids = ids, special

    def token_to_id(self, token: str) -> int | None:
        return self.ids.get(token)


def test_format_from_tokenizer():
    assert ReasoningFormat.from_tokenizer(_Vocab({"<think>": 5}, [])) is None
    fmt = ReasoningFormat.from_tokenizer(_Vocab({"<think>": 5, "</think>": 6}, [0]))
    assert fmt == ReasoningFormat(5, 6)
    with pytest.raises(ModelLoadError, match="special"):
        ReasoningFormat.from_tokenizer(_Vocab({"<think>": 5, "</think>": 6}, [6]))


def decode(tokens: list[int]) -> str:
    names = {START_ID: " <think> ", END_ID: " </think> "}
    return "".join(names.get(t, f" w{t} ") for t in tokens)


@settings(max_examples=300, deadline=None)
@given(
    prompt_opens=st.booleans(),
    budget=st.none() | st.integers(0, 6),
    model_tokens=st.lists(st.sampled_from([START_ID, END_ID, 10, 11, 12, 13]), max_size=30),
)
def test_engine_and_parser_agree(prompt_opens, budget, model_tokens):
    prompt, in_reasoning = FMT.prepare_prompt([7, START_ID] if prompt_opens else [7], budget)
    state = FMT.new_state(prompt, budget)
    assert state.is_thinking == in_reasoning
    output = run(state, model_tokens)
    thinking, answer = [], []
    labels = FMT.new_state(prompt, budget)  # replay to label each output token
    for token in output:
        was_thinking = labels.is_thinking
        labels.observe(token)
        if token == END_ID or (token == START_ID and not was_thinking):
            continue  # markers; a <think> inside a block is a thinking token (and text)
        (thinking if was_thinking else answer).append(decode([token]).strip())
    split = FMT.parser().parse(decode(output), in_reasoning)
    assert split.reasoning.split() == thinking
    assert split.content.split() == answer
    assert len(thinking) == state.num_thinking_tokens
    assert len(answer) == state.num_answer_tokens
    if budget is not None:
        assert state.num_thinking_tokens <= budget
