"""auto's kernel plan: stable under timing noise, cached per machine, the same in every process."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.model import tuning_cache
from heddle.model.linear_plan import NOISY_SPREAD, DispatchLinear, tune_dispatch
from heddle.model.tuning_cache import plan_dispatch


class _Noisy:
    """A fake layer whose call advances a fake clock by cost(rows) times 1 +- noise."""

    def __init__(self, clock: list[float], cost, rng: random.Random, noise: float = 0.08,
                 in_features: int = 8) -> None:
        self.clock, self.cost, self.rng, self.noise = clock, cost, rng, noise
        self.in_features, self.out_features, self.dtype = in_features, 4, torch.float32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.clock[0] += self.cost(x.shape[0]) * self.rng.uniform(1 - self.noise, 1 + self.noise)
        return torch.zeros(x.shape[0], 4)


def test_noisy_tunings_pick_the_same_plan():
    # quantized 10 + 5r vs float 40 + r: 30 vs 44 at 4 rows (clear), 50 vs 48 at 8 (a near
    # tie: a rule taking the faster of noisy timings flips there from one tuning to the next).
    plans = set()
    for seed in range(20):
        now, rng = [0.0], random.Random(seed)
        layers = [DispatchLinear(_Noisy(now, lambda r: 10.0 + 5 * r, rng),  # type: ignore[arg-type]
                                 _Noisy(now, lambda r: 40.0 + r, rng),  # type: ignore[arg-type]
                                 None, "gate_up", max_rows=1 << 62) for _ in range(3)]
        choices = tune_dispatch(layers, clock=lambda now=now: now[0])
        plans.add((choices[0].max_rows, layers[0].max_rows))
    assert plans == {(4, 4)}


def _layers(noise: float, seed: int,
            in_features: int = 8) -> tuple[list[DispatchLinear], list[float]]:
    """Two kinds of three fake layers sharing one fake clock; costs as above, +-noise."""
    now, rng = [0.0], random.Random(seed)
    layers = []
    for kind in ("qkv", "down"):
        for _ in range(3):
            small = _Noisy(now, lambda r: 10.0 + 5 * r, rng, noise, in_features)
            large = _Noisy(now, lambda r: 40.0 + r, rng, noise, in_features)
            layers.append(DispatchLinear(small, large, None, kind, max_rows=1 << 62))  # type: ignore[arg-type]
    return layers, now


def _plan(layers: list[DispatchLinear], now: list[float], dtype=torch.float32,
          retune: bool = False, load: float = 0.0) -> str:
    return plan_dispatch(layers, dtype, retune, clock=lambda: now[0], load=lambda: load)


def test_the_plan_is_cached_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("HEDDLE_TUNING_CACHE", str(tmp_path))
    first, now = _layers(0.08, seed=0)
    description = _plan(first, now)
    assert description == "qkv: int8 at <= 4 rows; down: int8 at <= 4 rows"
    files = list(tmp_path.glob("plan-*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert saved["description"] == description and saved["plan"] == {"qkv": 4, "down": 4}
    assert set(saved["timings_us"]["qkv"]) == {"1", "2", "4", "8"}

    def no_timing(*args, **kwargs):
        raise AssertionError("a cached plan must not be timed again")

    monkeypatch.setattr(tuning_cache, "tune_dispatch", no_timing)
    # Timings that would now pick float everywhere: the cached plan still rules.
    second, now = _layers(0.08, seed=1)
    for layer in second:
        layer.small.cost = lambda r: 1000.0  # type: ignore[union-attr]
    assert _plan(second, now) == description
    assert [layer.max_rows for layer in second] == [4] * 6

    # retune, another dtype, other shapes, or a damaged file: timed again.
    for layers, dtype, retune in ((_layers(0.08, 2)[0], torch.float32, True),
                                  (_layers(0.08, 3)[0], torch.bfloat16, False),
                                  (_layers(0.08, 4, in_features=16)[0], torch.float32, False)):
        with pytest.raises(AssertionError, match="must not be timed"):
            plan_dispatch(layers, dtype, retune=retune)
    files[0].write_text("{not json")
    with pytest.raises(AssertionError, match="must not be timed"):
        plan_dispatch(_layers(0.08, 5)[0], torch.float32)


def test_a_plan_timed_on_a_busy_machine_is_cached_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HEDDLE_TUNING_CACHE", str(tmp_path))
    layers, now = _layers(0.9, seed=0)  # rounds spread far beyond NOISY_SPREAD
    with caplog.at_level("WARNING", logger="heddle.model.tuning_cache"):
        _plan(layers, now)
    assert "noisy" in caplog.text and "--retune-kernels" in caplog.text
    (file,) = tmp_path.glob("plan-*.json")
    assert json.loads(file.read_text())["spread"] > NOISY_SPREAD
    caplog.clear()
    quiet, now = _layers(0.02, seed=0)  # timed again (retune) on a quiet machine: replaced
    _plan(quiet, now, retune=True)
    assert "noisy" not in caplog.text
    assert json.loads(file.read_text())["spread"] < NOISY_SPREAD


def test_a_busy_plan_is_timed_again_once_the_machine_is_quiet(tmp_path, monkeypatch):
    monkeypatch.setenv("HEDDLE_TUNING_CACHE", str(tmp_path))
    # Timed at a load of 1.5 per CPU (a busy box): cached, marked busy.
    busy_plan = _plan(_layers(0.02, seed=0)[0], [0.0], load=1.5)
    (file,) = tmp_path.glob("plan-*.json")
    saved = json.loads(file.read_text())
    assert saved["load_per_cpu"] == 1.5 and tuning_cache.timed_busy(saved)
    calls = []
    real_tune = tuning_cache.tune_dispatch

    def counting_tune(*args, **kwargs):
        calls.append(1)
        return real_tune(*args, **kwargs)

    monkeypatch.setattr(tuning_cache, "tune_dispatch", counting_tune)
    # Still busy (or only fairly quiet): every process shares the cached plan, none times.
    for load in (1.2, 0.5, tuning_cache.QUIET_LOAD):
        layers, now = _layers(0.02, seed=1)
        assert _plan(layers, now, load=load) == busy_plan
    assert calls == []
    # The first process on a quiet machine times it again and replaces it ...
    quiet, now = _layers(0.02, seed=2)
    for layer in quiet:  # the quiet timings say float everywhere
        layer.small.cost = lambda r: 1000.0  # type: ignore[union-attr]
    assert _plan(quiet, now, load=0.05) == "qkv: float; down: float"
    assert len(calls) == 1
    saved = json.loads(file.read_text())
    assert saved["load_per_cpu"] == 0.05 and not tuning_cache.timed_busy(saved)
    # ... once: the quiet plan is final, even on a quiet machine.
    layers, now = _layers(0.02, seed=3)
    assert _plan(layers, now, load=0.0) == "qkv: float; down: float"
    assert len(calls) == 1
    # A plan cached before the load was recorded counts as busy.
    del saved["load_per_cpu"]
    file.write_text(json.dumps(saved))
    _plan(_layers(0.02, seed=4)[0], [0.0], load=0.0)
    assert len(calls) == 2


@pytest.mark.slow
def test_two_processes_pick_the_same_kernels(tmp_path, monkeypatch, capsys):
    """The embedded model with quantization auto: this process tunes, a second process (as an
    engine core would) loads the same plan, and `python -m heddle.model.tuning_cache` prints it."""
    from heddle.model.executor import ModelExecutor

    monkeypatch.setenv("HEDDLE_TUNING_CACHE", str(tmp_path))
    cache = CacheConfig(block_size=16, num_blocks=8)
    here = ModelExecutor(ModelConfig(quantization="auto", num_threads=1), cache).quantization
    if here in ("none", "auto (no layer has two kernels)"):
        pytest.skip(f"auto has nothing to tune on this machine ({here})")
    script = ("from heddle.config import CacheConfig, ModelConfig\n"
              "from heddle.model.executor import ModelExecutor\n"
              "print(ModelExecutor(ModelConfig(quantization='auto', num_threads=1),"
              " CacheConfig(block_size=16, num_blocks=8)).quantization)\n")
    there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, timeout=300).stdout.strip().splitlines()[-1]
    assert there == here
    tuning_cache.main()
    printed = capsys.readouterr().out
    assert here.removeprefix("auto (").removesuffix(")") in printed
