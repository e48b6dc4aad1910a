"""benchmarks/predictor_accuracy_real.py's replay, on hand-made timelines (no model)."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


def _sequential(lengths: list[int], classes: list[str]):
    """One stream: request i arrives at 2i, has each checkpoint's tokens at 2i + 0.5 and
    finishes at 2i + 1, before the next arrives."""
    from predictor_accuracy_real import Record

    return [Record(arrival=2.0 * i, finish=2.0 * i + 1, output_len=n, request_class=cls,
                   reached={64: 2.0 * i + 0.5, 256: 2.0 * i + 0.5})
            for i, (n, cls) in enumerate(zip(lengths, classes, strict=True))]


def test_replay_pairs_only_running_kept_requests_and_ranks_classes_exactly():
    from predictor_accuracy_real import replay_accuracy

    n = 80  # short "a" (10 tokens) and long "b" (300) in turn; the first 20 are warm-up
    records = _sequential([10 if i % 2 == 0 else 300 for i in range(n)],
                          ["a" if i % 2 == 0 else "b" for i in range(n)])
    out = replay_accuracy(records, warmup=0.25)
    # At 0 every kept request; by then 10 of each class have finished: both rank exactly.
    assert out["0"]["requests"] == 60 and out["0"]["pairs"] == 60 * 59 // 2
    assert out["0"]["tau_repredict"] == pytest.approx(1.0)
    assert out["0"]["tau_arrival"] == pytest.approx(1.0)
    # At 64 and 256 only the long ones still run; their remaining lengths are all alike.
    for c in ("64", "256"):
        assert out[c]["requests"] == 30 and out[c]["pairs"] == 30 * 29 // 2
        assert math.isnan(out[c]["tau_repredict"])


def test_replay_learns_nothing_from_finishes_it_could_not_have_seen():
    from predictor_accuracy_real import replay_accuracy

    records = _sequential([10 if i % 2 == 0 else 300 for i in range(40)],
                          ["a" if i % 2 == 0 else "b" for i in range(40)])
    for r in records:  # all arrive (and pass each checkpoint) before anything finishes
        r.arrival, r.reached = 0.0, {64: 0.5, 256: 0.5}
    out = replay_accuracy(records, warmup=0.0)
    assert out["0"]["requests"] == 40
    # Every prediction is the default: constant, so no rank agreement at all.
    assert math.isnan(out["0"]["tau_repredict"]) and math.isnan(out["0"]["tau_arrival"])


def _closed_loop(lengths: list[int], streams: int, max_tokens: int):
    """The run's timeline as run_real records it: `streams` in flight, a request added at
    step s (arrival s - 0.5) as soon as one finished in step s - 1, one token a step each."""
    from predictor_accuracy_real import Record

    records, running, step, nxt = [], {}, 0, 0
    while nxt < len(lengths) or running:
        while len(running) < streams and nxt < len(lengths):
            records.append(Record(arrival=step - 0.5, finish=-1.0, output_len=0,
                                  max_tokens=max_tokens))
            running[nxt], nxt = 0, nxt + 1
        for i in list(running):
            running[i] += 1
            if running[i] in (64, 256):
                records[i].reached[running[i]] = float(step)
            if running[i] == lengths[i]:
                records[i].finish, records[i].output_len = step + 0.25, lengths[i]
                records[i].finish_reason = "length" if lengths[i] == max_tokens else "stop"
                del running[i]
        step += 1
    return records


def test_a_partial_run_is_scored_only_on_its_first_arrivals_that_all_finished(tmp_path):
    import json

    from predictor_accuracy_real import _dump, load_records, replay_accuracy

    lengths = [(37 * i) % 300 + 5 for i in range(60)]
    records = _closed_loop(lengths, streams=4, max_tokens=300)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"args": {"requests": 60}, "records": _dump(records)}))
    loaded, meta = load_records(path, streams=4)
    assert meta["complete"] == 60 and [r.max_tokens for r in loaded] == [300] * 60
    # Cut the run at step t: the finished ones are written, the rest are not.
    t = records[30].finish - 1
    started = sum(r.arrival < t for r in records)
    first_open = min(i for i, r in enumerate(records) if r.finish > t)
    assert first_open < started  # some that arrived have not finished: a real cut
    path.write_text(json.dumps({"steps": int(t), "started": started,
                                "records": _dump([r for r in records if r.finish <= t])}))
    loaded, meta = load_records(path, streams=4)
    expected = sum(r.arrival < records[first_open].arrival for r in records)
    assert meta["complete"] == expected
    out = replay_accuracy(loaded, warmup=0.0, scored=meta["complete"])
    assert out["0"]["requests"] == expected  # every scored one, none of the later ones
    assert sum(out["0"]["requests_halves"]) == expected
    assert out["0"]["requests_halves"][0] == expected // 2
