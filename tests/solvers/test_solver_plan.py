"""The solve policy (solvers/plan.py) on plain problems: which plan a budget gets, in milliseconds."""

from __future__ import annotations

import dataclasses

import pytest

from remat import solvers
from remat.solvers import plan as policy
from remat.solvers.errors import BudgetError
from remat.solvers.plan import Once, Request, breakdown_at_peak, solve
from remat.solvers.solution import Status
from remat.solvers.testing import random_problem

from .conftest import branch_problem, view_problem

SEEDS = range(6)


def problem_of(seed: int):  # type: ignore[no-untyped-def]
    return random_problem(seed, 10, 6)


def counted_lowest(problem):  # type: ignore[no-untyped-def]
    return Once(lambda: policy.smallest_peak(problem, Request().config))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("budget", ["none", "store-all", "twice store-all"])
def test_an_unbinding_budget_gets_the_fastest_plan_and_solves_no_smallest_peak(seed: int, budget: str) -> None:
    problem = problem_of(seed)
    kept_all = solvers.store_all(problem)
    budget_bytes = {"none": None, "store-all": kept_all.peak_bytes, "twice store-all": 2 * kept_all.peak_bytes}[budget]
    lowest = counted_lowest(problem)
    plan, store_all = solve(problem, Request(budget_bytes), lowest)
    assert not lowest.done
    assert plan.added_seconds <= store_all.added_seconds + 1e-12 and plan.peak_bytes <= kept_all.peak_bytes


@pytest.mark.parametrize("seed", SEEDS)
def test_below_the_smallest_peak_the_error_names_it_and_what_fills_it(seed: int) -> None:
    problem = problem_of(seed)
    lowest = policy.smallest_peak(problem, Request().config)
    with pytest.raises(BudgetError) as caught:
        solve(problem, Request(lowest.peak_bytes - 1))
    assert caught.value.min_feasible_bytes == lowest.peak_bytes and caught.value.budget_bytes == lowest.peak_bytes - 1
    assert "Raise budget_gb to at least" in str(caught.value)
    # with a headroom fraction the smallest budget is the peak over what the plan may use
    with pytest.raises(BudgetError) as held:
        solve(problem, Request(lowest.peak_bytes, headroom=0.5))
    assert held.value.min_feasible_bytes == 2 * lowest.peak_bytes and "50% held back" in str(held.value)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_breakdown_at_the_peak_sums_to_the_peak(seed: int) -> None:
    problem = problem_of(seed)
    for plan in (solvers.store_all(problem), solvers.recompute_all(problem),
                 policy.smallest_peak(problem, Request().config)):
        assert sum(breakdown_at_peak(problem, plan).values()) == plan.peak_bytes


def test_the_breakdown_names_recomputed_and_kept_values() -> None:
    """branch_problem: recomputing b reaches 230 B at step 4 (x 10, a 100, b 100 back again, out 10, g2 10)."""
    problem = branch_problem()
    plan = solvers.evaluate(problem, {"a"})
    assert plan.recomputed == {"b"} and plan.peak_bytes == 320
    parts = breakdown_at_peak(problem, plan)
    assert sum(parts.values()) == 320 and parts["kept activations"] == 100


def test_the_breakdown_names_memory_outside_the_graph_as_its_caller_does() -> None:
    """The solver adds the caller's parts (alive at every step, or at the hand-off between forward
    and backward) under the caller's own names, and says nothing of what they are."""
    problem = dataclasses.replace(branch_problem(), outside=(("shards", 7), ("buffers", 5)),
                                  handoff=(("the loss", 1000),))
    plan = solvers.evaluate(problem, {"a"})
    parts = breakdown_at_peak(problem, plan)
    assert sum(parts.values()) == plan.peak_bytes
    assert parts["shards"] == 7 and parts["buffers"] == 5
    # the hand-off (1000 B at the forward's last step) makes that step the peak
    assert parts["the loss"] == 1000 and plan.peak_bytes > 1000
    quiet = breakdown_at_peak(dataclasses.replace(problem, handoff=()), plan)
    assert "the loss" not in quiet and not any("rank" in k or "eager" in k for k in parts)


@pytest.mark.parametrize("seed", SEEDS)
def test_below_the_smallest_peak_a_caller_may_settle_for_it(seed: int) -> None:
    problem = problem_of(seed)
    plan, _ = solve(problem, Request(1), settle_for_lowest=True)
    assert plan.peak_bytes == policy.smallest_peak(problem, Request().config).peak_bytes
    assert any("smallest-peak plan" in n for n in plan.notes)


def test_a_failing_solver_falls_back_to_the_fastest_cheap_plan_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = branch_problem()
    monkeypatch.setattr(policy, "get", lambda name: Raising())
    plan, _ = solve(problem, Request(330))
    assert plan.status is Status.FALLBACK and plan.peak_bytes <= 330
    assert any("failed (RuntimeError: library crashed)" in n for n in plan.notes)
    # no cheap plan fits: the smallest-peak plan does (the budget is at or above its peak)
    monkeypatch.setattr(policy, "cheap_plans", lambda problem, cap: [solvers.store_all(problem)])
    plan, _ = solve(problem, Request(230))
    assert plan.status is Status.FALLBACK and plan.peak_bytes == 230


class Raising:
    def solve(self, problem, budget, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("library crashed")


def test_an_extra_plan_is_taken_where_it_fits_and_is_faster() -> None:
    """branch_problem at 330 B: the ILP recomputes b (0.1 s). A peer recomputing nothing is
    faster but peaks at 420 B and is ignored; with b cheaper to keep, the peer wins."""
    problem = branch_problem()
    plan, _ = solve(problem, Request(330))
    assert plan.recomputed == {"b"}
    store_all = solvers.store_all(problem)
    assert solve(problem, Request(330), extra=[store_all])[0].recomputed == {"b"}  # does not fit
    faster = solvers.evaluate(problem, {"a", "b"}, solver="peer")
    chosen = policy.fastest_of(plan, [faster], 1000)
    assert chosen.solver == "peer" and any("faster under the model" in n for n in chosen.notes)


def test_a_peer_saving_a_view_keeps_its_base() -> None:
    problem = view_problem()
    assert policy.kept_in_model(problem, ["v", "no_such_node"]) == {"a"}
    peak, seconds = policy.score_peer(problem, ["v"], "peer")
    assert peak == solvers.store_all(problem).peak_bytes and seconds == 0.0


def test_the_request_target_holds_back_the_headroom() -> None:
    assert Request(1000).target == 1000 and Request(1000, headroom=0.2).target == 800 and Request().target is None


def test_the_save_matmuls_baseline_keeps_matmul_class_values_only() -> None:
    """branch_problem with a a matmul: Megatron-style keeps a and recomputes b from it."""
    import dataclasses

    problem = branch_problem()
    values = tuple(dataclasses.replace(v, category="matmul") if v.name == "a" else v for v in problem.values)
    problem = dataclasses.replace(problem, values=values)
    plan = solvers.get("save-matmuls").solve(problem, None)
    assert plan.saved == {"a"} and plan.recomputed == {"b"} and plan.peak_bytes == 320
    assert solvers.save_matmuls(branch_problem()).saved == frozenset()  # no matmul: recompute what it can


def test_at_the_smallest_budget_the_smallest_peak_plan_seeds_the_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the smallest peak no cheap plan may fit; when the solver stops with no plan of its own
    (a time limit), the smallest-peak plan it was seeded with is returned, not NoPlanFound."""
    from remat.solvers import ilp
    from remat.solvers.backends import Outcome

    problem = random_problem(18, 16, 8)  # no cheap plan nor rounding reaches its smallest peak
    lowest = policy.smallest_peak(problem, Request().config)
    real = ilp.run_backend

    def no_plan(prob, config):  # type: ignore[no-untyped-def]
        if all(v.cat == "Continuous" for v in prob.variables()):
            return real(prob, config)  # the relaxation behind the roundings
        return Outcome(None, reason="time limit reached with no plan")

    monkeypatch.setattr(ilp, "run_backend", no_plan)
    with pytest.raises(solvers.NoPlanFound):
        solvers.solve_ilp(problem, lowest.peak_bytes)
    plan = solvers.solve_ilp(problem, lowest.peak_bytes, seeds=[lowest])
    assert plan.status is Status.FALLBACK and plan.peak_bytes <= lowest.peak_bytes
    assert any("time limit reached with no plan" in n for n in plan.notes)


def _plans_at_random_budgets(seed: int) -> tuple[list, list[int]]:
    """Plans of random problems' baselines and ILP at several caps, shuffled: some a cap's own
    solve would not pick (a greedy plan where a faster one fits), as a time-limited solve may."""
    import random

    problem = problem_of(seed)
    pick = random.Random(seed)
    low, high = policy.smallest_peak(problem, Request().config).peak_bytes, policy.store_all(problem).peak_bytes
    caps = sorted(pick.randint(low, high) for _ in range(5))
    plans = [pick.choice([p for p in policy.cheap_plans(problem, cap) if p.peak_bytes <= cap]
                         + [solve(problem, Request(budget_bytes=cap))[0]]) for cap in caps]
    return plans, caps


@pytest.mark.parametrize("seed", SEEDS)
def test_a_sweep_made_monotone_never_gives_a_lower_budget_a_faster_plan_or_a_higher_peak(seed: int) -> None:
    plans, caps = _plans_at_random_budgets(seed)
    chosen = policy.monotone(plans, caps)
    for cap, plan in zip(caps, chosen):
        assert plan.peak_bytes <= cap and plan.saved in {p.saved for p in plans}
    for lower, higher in zip(chosen, chosen[1:]):
        assert lower.added_seconds >= higher.added_seconds and lower.peak_bytes <= higher.peak_bytes
    for own, plan in zip(plans, chosen):  # never slower than the cap's own plan
        assert plan.added_seconds <= own.added_seconds


def test_a_budget_with_no_plan_stays_without_one() -> None:
    plans, caps = _plans_at_random_budgets(0)
    assert policy.monotone([None, *plans[1:]], caps)[0] is None
