"""Prompt lookup: latest earlier match, longest n first, incremental index equal to a scan."""

from __future__ import annotations

import random

from heddle.spec.ngram import NgramProposer


def scan(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Reference: search backwards for the latest earlier occurrence of the last n tokens."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : min(start + n + k, length)]
    return []


def test_copies_what_followed_the_match():
    proposer = NgramProposer(min_n=2, max_n=3)
    tokens = [5, 6, 7, 8, 9, 1, 6, 7]
    assert proposer.propose("r", tokens, 3) == [8, 9, 1]
    assert proposer.propose("r", tokens, 1) == [8]


def test_longest_n_wins_and_latest_occurrence_wins():
    proposer = NgramProposer(min_n=1, max_n=3)
    # (2, 3) occurs twice; the 3-gram (1, 2, 3) only first: the longer match is taken.
    assert proposer.propose("a", [1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3], 2) == [4, 9]
    # Only 2-grams match: the latest occurrence is taken.
    assert proposer.propose("b", [1, 2, 3, 4, 7, 2, 3, 5, 8, 2, 3], 1) == [5]


def test_no_match_and_no_budget():
    proposer = NgramProposer()
    assert proposer.propose("r", [1, 2, 3, 4], 4) == []
    assert proposer.propose("r", [1, 2, 1, 2], 0) == []


def test_incremental_index_equals_a_scan():
    rng = random.Random(0)
    proposer = NgramProposer(min_n=1, max_n=4)
    tokens: list[int] = [rng.randrange(6) for _ in range(3)]
    for _ in range(300):
        k = rng.randrange(1, 6)
        assert proposer.propose("r", tokens, k) == scan(tokens, k, 1, 4)
        tokens.extend(rng.randrange(6) for _ in range(rng.randrange(1, 4)))


def test_reused_id_is_reindexed():
    proposer = NgramProposer(min_n=1, max_n=2)
    assert proposer.propose("r", [1, 2, 3, 1], 2) == [2, 3]
    assert proposer.propose("r", [4, 5, 4], 2) == [5, 4]
    proposer.forget(["r"])
    assert proposer.propose("r", [7, 8, 7], 1) == [8]
