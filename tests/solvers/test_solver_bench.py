"""ILP solve time at a realistic size (run with -m slow -s to see timings)."""

from __future__ import annotations

import time

import pytest

from remat.solvers import ILPConfig, Status, min_peak, solve_ilp, store_all
from remat.solvers.testing import random_problem

SECONDS = 5.0  # "a few seconds at most" for one solve on 2 cores


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_ilp_solves_seven_hundred_candidates_in_seconds(seed: int) -> None:
    problem = random_problem(seed, 900, 700)
    config = ILPConfig(threads=2)
    floor = min_peak(problem, config=config).peak_bytes
    ceiling = store_all(problem).peak_bytes
    print(f"\nseed {seed}: {problem.num_steps} steps, {len(problem.candidates())} candidates")
    for fraction in (0.0, 0.1, 0.25, 0.5, 1.0):
        budget = int(floor + fraction * (ceiling - floor))
        start = time.perf_counter()
        plan = solve_ilp(problem, budget, config=config)
        seconds = time.perf_counter() - start
        print(f"  budget {budget}: {seconds:.2f} s, {plan.status.value}, gap {plan.gap}")
        assert plan.peak_bytes <= budget and plan.status is Status.OPTIMAL
        assert seconds < SECONDS
