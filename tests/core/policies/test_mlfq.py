from __future__ import annotations

import pytest

from heddle.core.policies import make_policy
from heddle.errors import HeddleError
from heddle.request import RequestStatus
from tests.factories import create_request, create_scheduler, sample_all


def step(sched):
    out = sched.schedule()
    sched.update(out, sample_all(out))
    return out.scheduled_tokens(), out.preempted_request_ids


def test_skip_join_enters_long_prompts_at_lower_levels():
    policy = make_policy("mlfq", num_levels=4, prompt_quantum=16)
    levels = {
        n: policy.level_of(create_request(f"p{n}", prompt_len=n), 0.0)
        for n in (8, 16, 17, 40, 1000)
    }
    assert levels == {8: 0, 16: 0, 17: 1, 40: 2, 1000: 3}


def test_quantum_doubles_per_level():
    policy = make_policy("mlfq", num_levels=3, quantum=2)
    request = create_request("r", max_tokens=100)
    levels = []
    for _ in range(10):
        levels.append(policy.level_of(request, 0.0))
        request.append_output_token(7)
    # 2 tokens at level 0, 4 at level 1, then the bottom level keeps it.
    assert levels == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]


def test_phase_aware_promotes_a_request_once_when_its_answer_starts():
    from heddle.reasoning import Phase, ReasoningState

    levels = {}
    for aware in (False, True):
        policy = make_policy("mlfq", num_levels=3, quantum=2, phase_aware=aware)
        request = create_request("r", max_tokens=100)
        request.reasoning = ReasoningState(phase=Phase.THINKING, true_thinking_len=8)
        seen = []
        for _ in range(12):
            seen.append(policy.level_of(request, 0.0))
            request.append_output_token(7)
            request.reasoning.observe(7)
        levels[aware] = seen
    # Thinking sinks as any long output; the answer (from token 8 on) starts at the top again.
    assert levels[False] == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]
    assert levels[True] == [0, 0, 1, 1, 1, 1, 2, 2, 0, 0, 1, 1]


def test_phase_aware_ranks_every_answer_above_every_thinker():
    """Under overload every queued request starves and is promoted to the top level; with the
    phases split, a promoted old thinker still ranks behind a new request that answers."""
    from heddle.reasoning import Phase, ReasoningState

    for aware in (False, True):
        policy = make_policy("mlfq", quantum=1, starvation_seconds=5.0, phase_aware=aware)
        thinker = create_request("think", max_tokens=100, arrival_time=0.0)
        thinker.reasoning = ReasoningState(phase=Phase.THINKING, true_thinking_len=50)
        chat = create_request("chat", max_tokens=100, arrival_time=9.0)
        assert policy.level_of(thinker, 0.0) == policy.level_of(chat, 9.0) == 0
        first = min((thinker, chat), key=lambda r: policy.sort_key(r, 9.0)).request_id
        assert first == ("chat" if aware else "think")
        assert policy.should_preempt_for(chat, thinker, 9.0) is aware
        assert not policy.should_preempt_for(thinker, chat, 9.0)


def test_a_demoted_long_generation_is_overtaken_by_a_new_short_request():
    sched = create_scheduler(policy="mlfq", max_num_seqs=1, quantum=2)
    long = create_request("long", prompt_len=4, max_tokens=20)
    sched.add_request(long)
    trace = [step(sched)]  # first token
    sched.add_request(create_request("early", prompt_len=4, max_tokens=2, first_token=200))
    trace.append(step(sched))  # same level as long: waits; long reaches its quantum
    sched.add_request(create_request("late", prompt_len=4, max_tokens=2, first_token=300))
    trace += [step(sched), step(sched), step(sched), step(sched)]
    assert trace == [
        ({"long": 4}, []),
        ({"long": 1}, []),
        ({"early": 4}, ["long"]),  # long is demoted to level 1: both newcomers overtake it
        ({"early": 1}, []),
        ({"late": 4}, []),
        ({"late": 1}, []),
    ]
    assert long.status is RequestStatus.PREEMPTED and long.num_output_tokens == 2
    # Back in: the first block is still in the prefix cache; the other two tokens are recomputed.
    assert step(sched) == ({"long": 2}, [])


def test_starving_requests_are_promoted_to_the_top():
    policy = make_policy("mlfq", quantum=1, prompt_quantum=4, starvation_seconds=5.0)
    request = create_request("r", prompt_len=8, max_tokens=100, arrival_time=0.0)
    assert policy.level_of(request, 0.0) == 1
    request.append_output_token(7)
    request.append_output_token(7)
    assert policy.level_of(request, 4.0) == 2  # demoted after level 1's 2 tokens
    assert policy.level_of(request, 5.0) == 0  # 5 s without service since it arrived
    assert policy.level_of(request, 6.0) == 0  # with a fresh level-0 quantum
    request.append_output_token(7)
    assert policy.level_of(request, 6.0) == 1


def test_max_preemptions_bounds_how_often_a_request_is_evicted_for_a_newcomer():
    # One seat; "long" is demoted after 2 tokens, and each newcomer would evict it again.
    def run(max_preemptions):
        sched = create_scheduler(
            policy="mlfq", max_num_seqs=1, quantum=2, max_preemptions=max_preemptions
        )
        long = create_request("long", prompt_len=4, max_tokens=20)
        sched.add_request(long)
        evicted = []
        for i in range(12):
            if i in (2, 6):
                sched.add_request(create_request(f"new{i}", prompt_len=4, max_tokens=2))
            evicted += step(sched)[1]
        return evicted, long

    assert run(None)[0] == ["long", "long"]
    evicted, long = run(1)
    assert evicted == ["long"]  # the second newcomer waits for the seat instead
    assert long.record.num_preemptions == 1


def test_max_preemptions_must_not_be_negative():
    with pytest.raises(HeddleError, match="max_preemptions"):
        make_policy("mlfq", max_preemptions=-1)
