"""Routing policies on hand-built replica states."""

from __future__ import annotations

import pytest

from heddle.errors import HeddleError
from heddle.router import ReplicaReport, Router, RouteRequest, available_routers
from heddle.router.prefix_index import PrefixIndex

BS = 16


def request(
    rid: str = "r",
    prompt: list[int] | None = None,
    max_tokens: int = 10,
    session: str | None = None,
    cls: str = "default",
    priority: int = 0,
) -> RouteRequest:
    return RouteRequest(rid, prompt or [7] * 32, max_tokens, cls, priority, session)


def router(name: str, loads: list[int], queues: list[int] | None = None, **options) -> Router:
    """A router whose replicas reported these outstanding tokens (and queue lengths)."""
    r = Router(name, len(loads), block_size=BS, **options)
    for i, load in enumerate(loads):
        q = queues[i] if queues else 0
        r.report(i, ReplicaReport(num_running=q, outstanding_tokens=load, kv_blocks_total=1000))
    return r


def prompt(seed: int, n: int = 512) -> list[int]:
    return [(seed * 7919 + i) % 30000 + 100 for i in range(n)]


def test_every_policy_is_registered() -> None:
    assert available_routers() == [
        "affinity",
        "class-aware",
        "least-tokens",
        "pow2",
        "ray-prefix",
        "round-robin",
    ]
    with pytest.raises(HeddleError, match="unknown router"):
        Router("nope", 2)
    with pytest.raises(HeddleError, match="bad options"):
        Router("affinity", 2, margin_tokens=-1)


def test_round_robin_cycles_and_skips_dead_replicas() -> None:
    r = router("round-robin", [0, 0, 0])
    assert [r.route(request()) for _ in range(4)] == [0, 1, 2, 0]
    r.mark_down(2)
    assert [r.route(request()) for _ in range(3)] == [1, 0, 1]
    r.mark_up(2)
    assert [r.route(request()) for _ in range(3)] == [2, 0, 1]


def test_least_tokens_counts_what_it_sent_since_the_report() -> None:
    r = router("least-tokens", [1000, 200, 500])
    assert r.route(request(max_tokens=400 - 32)) == 1  # replica 1 now at 200 + 400
    assert r.route(request(max_tokens=10)) == 2  # 500 < 600
    # A report that has seen both sends replaces the router's own count.
    r.report(1, ReplicaReport(outstanding_tokens=50, num_received=1))
    assert r.route(request()) == 1


def test_pow2_picks_the_shorter_queue_of_two() -> None:
    r = router("pow2", [0, 0, 0, 0], queues=[9, 9, 9, 0], seed=3)
    picks = [r.policy.choose(request(), r.healthy()).replica_id for _ in range(200)]
    # Replica 3 wins every draw it is in (half of them), never loses one.
    assert 70 < picks.count(3) < 130
    two = router("pow2", [0, 0], queues=[5, 1])
    assert {two.policy.choose(request(), two.healthy()).replica_id for _ in range(20)} == {1}


def test_affinity_keeps_a_session_on_its_replica() -> None:
    r = router("affinity", [0, 0, 0, 0])
    first = r.route(request("t0", prompt(1), session="s"))
    assert first == 0
    # Other replicas are now less loaded, but the session's home holds its KV.
    later = [r.route(request(f"t{i}", prompt(1) + prompt(i, 64), session="s")) for i in range(2, 6)]
    assert later == [first] * 4
    assert r.policy.num_home == 4


def test_affinity_follows_a_shared_prefix_without_a_session() -> None:
    r = router("affinity", [0, 0, 0])
    r.report(0, ReplicaReport(outstanding_tokens=3000))
    home = r.route(request("a", prompt(5)))
    assert home == 1
    r.finished(request("a", prompt(5)), 1, prompt(6, 100))
    # Prompt + output of "a" + a new turn: replica 1 has 612 of its tokens cached.
    follow = request("b", prompt(5) + prompt(6, 100) + prompt(7, 40))
    r.report(1, ReplicaReport(outstanding_tokens=1500, num_received=1))
    assert r.route(follow) == 1


def test_affinity_leaves_an_overloaded_home_by_the_stated_margin() -> None:
    r = router("affinity", [0, 0], margin_tokens=1000, margin_ratio=0.0)
    assert r.route(request("a", prompt(1), session="s")) == 0
    # Home cost = 1400 + 0 uncached (all 512 cached), other = 0 + 512: within the margin.
    r.report(0, ReplicaReport(outstanding_tokens=1400, num_received=1, kv_blocks_total=1000))
    assert r.route(request("b", prompt(1), session="s")) == 0
    r.report(0, ReplicaReport(outstanding_tokens=1600, num_received=2, kv_blocks_total=1000))
    assert r.route(request("c", prompt(1), session="s")) == 1
    assert r.policy.num_moved == 1
    # The session moved: its home is now replica 1.
    r.report(0, ReplicaReport(outstanding_tokens=0, num_received=2, kv_blocks_total=1000))
    assert r.route(request("d", prompt(1), session="s")) == 1


def test_affinity_forgets_a_dead_replica() -> None:
    r = router("affinity", [0, 0])
    assert r.route(request("a", prompt(1), session="s")) == 0
    r.mark_down(0)
    assert r.route(request("b", prompt(1), session="s")) == 1
    r.mark_up(0)
    r.report(1, ReplicaReport(outstanding_tokens=100, num_received=1))
    assert r.route(request("c", prompt(1), session="s")) == 1  # its KV is on 1 now


def test_ray_prefix_rule() -> None:
    r = router("ray-prefix", [0, 0, 0])
    # An empty tree: the smallest tenants (all), shortest queue among them.
    r.report(0, ReplicaReport(num_running=2))
    r.report(1, ReplicaReport(num_running=1))
    r.report(2, ReplicaReport(num_running=1))
    first = r.route(request("a", prompt(1)))
    assert first in (1, 2)
    # Same prefix, balanced queues (difference <= 10): the replica with the longest match.
    for i in range(3):
        r.report(i, ReplicaReport(num_running=5, num_received=r.replicas[i].num_sent))
    assert r.route(request("b", prompt(1) + prompt(9, 100))) == first
    # A match under 10% of the prompt: the smallest tenants (those never sent anything).
    for i in range(3):
        r.report(i, ReplicaReport(num_running=5, num_received=r.replicas[i].num_sent))
    empty = [i for i in range(3) if r.policy.index.num_blocks(i) == 0]
    assert empty and first not in empty
    assert r.route(request("c", prompt(1, 32) + prompt(11, 2000))) in empty
    # Imbalanced queues (> 10 apart): power of two choices, ignoring the prefix.
    r.report(first, ReplicaReport(num_running=50, num_received=r.replicas[first].num_sent))
    picks = {r.route(request(f"d{i}", prompt(1))) for i in range(20)}
    assert first not in picks


def test_class_aware_keeps_bulk_traffic_in_its_lane() -> None:
    r = router("class-aware", [0, 0, 0, 0], bulk_share=0.25, long_prompt_tokens=1000)
    assert r.policy.bulk_replicas == frozenset({3})
    # Long prompts and bulk classes go to replica 3, even when it is the busiest.
    r.report(3, ReplicaReport(outstanding_tokens=50_000))
    assert r.route(request("l", prompt(1, 1500))) == 3
    assert r.route(request("b", cls="batch")) == 3
    # Chat stays off a busy bulk replica, even when the latency replicas are busier still.
    for i in range(3):
        r.report(i, ReplicaReport(outstanding_tokens=40_000))
    assert {r.route(request(f"c{i}", prompt(i))) for i in range(6)} <= {0, 1, 2}
    # An idle bulk replica (under spill_ratio x the latency lane's floor) takes chat too.
    r.report(3, ReplicaReport(outstanding_tokens=100, num_received=2))
    assert r.route(request("c9", prompt(9))) == 3
    # A long prompt whose prefix a replica caches is a short prefill: not bulk.
    r.finished(request("l", prompt(1, 1500)), 3, [])
    assert not r.policy.is_bulk(request("l2", prompt(1, 1500) + prompt(2, 100)), r.healthy())
    assert r.policy.is_bulk(request("l3", prompt(77, 1500)), r.healthy())
    # A lane with no healthy replica spills rather than fail.
    r.mark_down(3)
    assert r.route(request("l4", prompt(2, 1500))) in (0, 1, 2)


def test_class_aware_priority_lane() -> None:
    r = router("class-aware", [0, 0], bulk_priority=5, inner="least-tokens")
    assert r.route(request(priority=9)) == 1
    assert r.route(request(priority=0)) == 0


def test_no_healthy_replica_is_unplaceable() -> None:
    r = router("least-tokens", [0, 0])
    r.mark_down(0)
    r.mark_down(1)
    assert r.route(request()) is None
    assert r.num_unplaced == 1


def test_prefix_index_lru_and_match() -> None:
    index = PrefixIndex(capacity_blocks=3)
    index.insert(0, [1, 2, 3])
    index.insert(1, [1, 2])
    assert index.match([1, 2, 3, 4], [0, 1]) == {0: 3, 1: 2}
    assert index.match([9, 1], [0, 1]) == {}
    index.insert(0, [7])  # evicts the oldest of replica 0 (hash 1): its chain is broken
    assert index.match([1, 2, 3], [0, 1]) == {1: 2}
    index.remove_replica(1)
    assert index.match([1, 2], [0, 1]) == {}
