"""Which CPUs the engine core and the front end get."""

from __future__ import annotations

from heddle.engine.cpus import CpuPlan, plan_cpus


def test_below_four_cpus_nothing_is_pinned_and_the_core_takes_every_cpu():
    assert plan_cpus([0, 1]) == CpuPlan(None, None, 2)
    assert plan_cpus([0]) == CpuPlan(None, None, 1)
    assert plan_cpus([0, 1, 2], num_threads=1) == CpuPlan(None, None, 1)


def test_from_four_cpus_the_front_end_gets_its_own():
    assert plan_cpus([3, 2, 1, 0]) == CpuPlan((0,), (1, 2, 3), 3)
    assert plan_cpus(range(8), num_threads=4) == CpuPlan((0,), (1, 2, 3, 4, 5, 6, 7), 4)
    assert plan_cpus(range(8), num_threads=64) == CpuPlan((0,), (1, 2, 3, 4, 5, 6, 7), 7)


def test_from_sixteen_cpus_the_front_end_gets_two():
    plan = plan_cpus(range(16))
    assert plan.frontend_cpus == (0, 1)
    assert plan.core_cpus == tuple(range(2, 16)) and plan.core_threads == 14
