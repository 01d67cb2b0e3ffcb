"""The plan at a budget solved near the shared plan (solvers/near.py, blocks.agreed_decisions)."""

from __future__ import annotations

import functools

import pytest

from remat.solvers import ILPConfig, min_peak, solve_ilp, store_all
from remat.solvers.blocks import agreed_decisions, takes
from remat.solvers import near
from remat.solvers.near import MIN_COPIES, many_blocks, solve_near
from remat.solvers.rounding import Relaxation
from remat.solvers.plan import Once, Request, solve
from remat.solvers.simulate import evaluate
from remat.solvers.testing import brute_force, chain_of_blocks

EXACT = ILPConfig(mip_gap=1e-9)


@functools.cache
def every_plan(seed: int) -> tuple:
    return tuple(brute_force(chain_of_blocks(5, seed)))


def halfway(problem, lowest) -> int:
    return (lowest.peak_bytes + store_all(problem).peak_bytes) // 2


def test_agreed_decisions_are_the_positions_every_plan_takes_alike_in_every_block() -> None:
    problem = chain_of_blocks(6)
    blocks = {v.name for v in problem.candidates() if v.name.startswith("l")}
    everything = evaluate(problem, blocks)
    middle_recomputed = evaluate(problem, {n for n in blocks if not n.endswith("_1")})
    fixed = agreed_decisions(problem, [everything, middle_recomputed])
    assert set(fixed) == {n for n in blocks if not n.endswith("_1")}  # position 1 differs in every block
    assert all(fixed[n] == (True, False) for n in fixed)
    assert takes(everything, fixed) and takes(middle_recomputed, fixed)


def test_a_block_that_decides_otherwise_frees_its_position_in_every_block() -> None:
    problem = chain_of_blocks(6)
    blocks = {v.name for v in problem.candidates() if v.name.startswith("l")}
    one_differs = evaluate(problem, blocks - {"l3_1"})
    fixed = agreed_decisions(problem, [store_all(problem), one_differs])
    assert not any(n.endswith("_1") for n in fixed) and len(fixed) == 12


@pytest.mark.parametrize("seed", range(4))
def test_fixed_decisions_give_the_fastest_plan_that_takes_them(seed: int) -> None:
    problem = chain_of_blocks(5, seed)
    lowest = min_peak(problem, config=EXACT)
    budget = halfway(problem, lowest)
    shared = solve_ilp(problem, budget, config=ILPConfig(mip_gap=1e-9, share_blocks=1))
    fixed = agreed_decisions(problem, [shared, lowest])
    plan = solve_ilp(problem, budget, config=EXACT, fixed=fixed)
    taking = [p for p in every_plan(seed) if takes(p, fixed) and p.peak_bytes <= budget]
    assert takes(plan, fixed) and plan.peak_bytes <= budget
    assert plan.added_seconds == pytest.approx(min(p.added_seconds for p in taking), abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_the_near_plan_lies_between_the_whole_optimum_and_the_shared_plan(seed: int) -> None:
    problem = chain_of_blocks(5, seed)
    lowest = min_peak(problem, config=EXACT)
    budget = halfway(problem, lowest)
    near = solve_near(problem, budget, config=EXACT, seeds=[lowest])
    shared = solve_ilp(problem, budget, config=ILPConfig(mip_gap=1e-9, share_blocks=1), seeds=[lowest])
    best = min(p.added_seconds for p in every_plan(seed) if p.peak_bytes <= budget)
    assert near.peak_bytes <= budget
    assert best - 1e-9 <= near.added_seconds <= shared.added_seconds + 1e-9
    fixed = agreed_decisions(problem, [shared, lowest])
    assert near.fixed_decisions == len(fixed) and takes(near, fixed) and "decisions fixed" in near.notes[-1]


def test_many_blocks_counts_one_list() -> None:
    assert many_blocks(chain_of_blocks(MIN_COPIES))
    assert not many_blocks(chain_of_blocks(MIN_COPIES - 1))


def test_a_binding_budget_on_many_blocks_is_solved_near_the_shared_plan() -> None:
    problem = chain_of_blocks(MIN_COPIES + 2, seed=1)
    lowest = min_peak(problem, config=ILPConfig(mip_gap=0.03, share_blocks=1))
    budget = halfway(problem, lowest)
    plan, _ = solve(problem, Request(budget), Once(lambda: lowest))
    whole = solve_ilp(problem, budget, config=ILPConfig())
    assert plan.peak_bytes <= budget and any("decisions fixed" in note for note in plan.notes)
    assert plan.added_seconds <= whole.added_seconds * 1.05  # near the whole program's plan on a chain


def test_few_blocks_are_solved_in_the_whole_program() -> None:
    problem = chain_of_blocks(4, seed=1)
    lowest = min_peak(problem, config=EXACT)
    plan, _ = solve(problem, Request(halfway(problem, lowest)), Once(lambda: lowest))
    assert plan.fixed_decisions == 0


def test_a_budget_that_does_not_bind_is_solved_in_the_whole_program() -> None:
    problem = chain_of_blocks(MIN_COPIES, seed=2)
    kept_all = store_all(problem)
    plan = solve_near(problem, kept_all.peak_bytes, config=EXACT)
    assert plan.fixed_decisions == 0 and plan.peak_bytes <= kept_all.peak_bytes
    planned, _ = solve(problem, Request(kept_all.peak_bytes * 2))
    assert planned.fixed_decisions == 0


def test_a_seed_that_does_not_take_the_fixed_decisions_is_no_warm_start() -> None:
    problem = chain_of_blocks(5, seed=3)
    blocks = {v.name for v in problem.candidates() if v.name.startswith("l")}
    middle_recomputed = evaluate(problem, {n for n in blocks if not n.endswith("_1")})
    kept_all = store_all(problem)
    fixed = agreed_decisions(problem, [middle_recomputed])
    assert fixed and not takes(kept_all, fixed)
    plan = solve_ilp(problem, kept_all.peak_bytes, config=EXACT, seeds=[kept_all], fixed=fixed)
    assert takes(plan, fixed)


def budget_at(problem, lowest, fraction: float) -> int:
    return int(lowest.peak_bytes + fraction * (store_all(problem).peak_bytes - lowest.peak_bytes))


@pytest.mark.parametrize("fraction", [0.05, 0.65, 0.9])
def test_a_plan_proven_from_the_relaxation_is_within_the_gap_of_the_near_optimum(fraction: float) -> None:
    """``polished``'s proof: its bound is at most the near program's optimum (solved exactly), and
    the plan it calls proven is within the gap of it. On 12 blocks the relaxation is tight enough
    at these budgets; on 96 it proves a plan in 35 s that branch and bound reached in 48."""
    problem = chain_of_blocks(12)
    lowest = min_peak(problem, config=ILPConfig(mip_gap=0.03, share_blocks=1))
    budget = budget_at(problem, lowest, fraction)
    shared = solve_ilp(problem, budget, config=ILPConfig(mip_gap=0.03, share_blocks=1), seeds=[lowest])
    fixed = agreed_decisions(problem, [shared, lowest])
    plan, proven = near.polished(problem, budget, ILPConfig(), fixed, [shared, lowest])
    best = solve_ilp(problem, budget, config=EXACT, fixed=fixed).added_seconds
    assert proven and takes(plan, fixed) and plan.peak_bytes <= budget
    assert plan.bound <= best + 1e-9 and 0 <= plan.gap <= 0.01
    assert best - 1e-9 <= plan.added_seconds <= best / (1 - 0.01) + 1e-9
    assert plan.added_seconds <= shared.added_seconds + 1e-12


def test_a_proof_from_the_relaxation_ends_the_solve_before_branch_and_bound(monkeypatch) -> None:
    problem = chain_of_blocks(12)
    lowest = min_peak(problem, config=ILPConfig(mip_gap=0.03, share_blocks=1))
    fixings = []
    real = near.solve_ilp
    monkeypatch.setattr(near, "solve_ilp", lambda *a, **k: fixings.append(k.get("fixed")) or real(*a, **k))
    plan = solve_near(problem, budget_at(problem, lowest, 0.65), config=ILPConfig(), seeds=[lowest])
    assert any("relaxation" in note for note in plan.notes) and plan.status.value == "optimal"
    assert len(fixings) == 2 and fixings[0] is None  # the shared solve, then the polished one: no third


def test_without_the_relaxation_the_near_program_is_solved_as_before(monkeypatch) -> None:
    problem = chain_of_blocks(MIN_COPIES + 2)
    lowest = min_peak(problem, config=ILPConfig(mip_gap=0.03, share_blocks=1))
    budget = halfway(problem, lowest)
    shared = solve_ilp(problem, budget, config=ILPConfig(mip_gap=0.03, share_blocks=1), seeds=[lowest])
    expected = solve_ilp(problem, budget, config=EXACT, fixed=agreed_decisions(problem, [shared, lowest]))
    relaxed = []
    monkeypatch.setattr(near, "relax", lambda model, config: relaxed.append(1) or Relaxation(False, {}, {}, None))
    plan = solve_near(problem, budget, config=EXACT, seeds=[lowest])
    assert relaxed and not any("relaxation" in note for note in plan.notes)
    assert plan.added_seconds == pytest.approx(expected.added_seconds, abs=1e-9)
