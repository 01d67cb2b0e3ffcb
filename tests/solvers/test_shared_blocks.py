"""Identical blocks sharing one set of decisions (solvers/blocks.py, ILPConfig.share_blocks)."""

from __future__ import annotations

import functools

import pytest

from remat.solvers import ILPConfig, min_peak, solve_ilp, store_all
from remat.solvers.blocks import consistent, shared_decisions, tied_blocks
from remat.solvers.model import recomputable
from remat.solvers.testing import brute_force, chain_of_blocks

EXACT = ILPConfig(mip_gap=1e-9)


def ties_of(problem, period=1):
    return shared_decisions(problem, recomputable(problem), period)


@functools.cache
def every_plan(seed: int) -> tuple:
    return tuple(brute_force(chain_of_blocks(5, seed)))


def block_of(name: str) -> int:
    return int(name[1:].split("_")[0])


def test_interior_copies_tie_to_the_first_interior_block() -> None:
    problem = chain_of_blocks(6)
    ties = ties_of(problem)
    assert {block_of(a) for a in ties} == {2, 3, 4}  # the first and the last decide for themselves
    assert {block_of(r) for r in ties.values()} == {1}
    assert all(a.split("_")[1] == r.split("_")[1] for a, r in ties.items())  # same position
    assert tied_blocks(problem, ties) == 4


def test_a_period_of_two_alternates_representatives() -> None:
    ties = ties_of(chain_of_blocks(8), period=2)
    assert {block_of(a): block_of(r) for a, r in ties.items()} == {3: 1, 4: 2, 5: 1, 6: 2}


def test_a_copy_that_differs_keeps_its_own_decisions() -> None:
    ties = ties_of(chain_of_blocks(6, odd=3))
    assert {block_of(a) for a in ties} == {2, 4}


def test_fewer_than_two_interior_copies_share_nothing() -> None:
    assert ties_of(chain_of_blocks(3)) == {}


@pytest.mark.parametrize("seed", range(4))
def test_shared_smallest_peak_is_the_least_among_plans_that_share(seed: int) -> None:
    problem = chain_of_blocks(5, seed)
    ties = ties_of(problem)
    plans = every_plan(seed)
    sharing = [p for p in plans if consistent(p.saved, p.recomputed, ties)]
    shared = min_peak(problem, config=ILPConfig(mip_gap=1e-9, share_blocks=1))
    assert consistent(shared.saved, shared.recomputed, ties)
    assert shared.peak_bytes == min(p.peak_bytes for p in sharing)
    assert shared.peak_bytes >= min(p.peak_bytes for p in plans)  # a restriction of the whole program
    assert shared.shared_blocks == 3 and "shared one set of decisions" in shared.notes[-1]


@pytest.mark.parametrize("seed", range(4))
def test_shared_plan_within_a_budget_is_the_fastest_that_shares(seed: int) -> None:
    problem = chain_of_blocks(5, seed)
    ties = ties_of(problem)
    lowest = min_peak(problem, config=EXACT)
    budget = (lowest.peak_bytes + store_all(problem).peak_bytes) // 2
    sharing = [p for p in every_plan(seed) if consistent(p.saved, p.recomputed, ties) and p.peak_bytes <= budget]
    plan = solve_ilp(problem, budget, config=ILPConfig(mip_gap=1e-9, share_blocks=1))
    assert plan.peak_bytes <= budget and consistent(plan.saved, plan.recomputed, ties)
    assert plan.added_seconds == pytest.approx(min(p.added_seconds for p in sharing), abs=1e-9)


def test_without_sharing_no_block_is_marked() -> None:
    plan = min_peak(chain_of_blocks(5), config=EXACT)
    assert plan.shared_blocks == 0
