"""What rank 0 sends the other ranks (passes/scope/ranks.py), without a process group: plan records in
another rank's node names, errors rebuilt as remat's own, graph fingerprints by position."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.fx as fx

from remat.passes.cache import plan_cache

from remat.passes.scope import ranks
from remat.solvers.errors import BudgetError, GraphError, PlanError
from remat.solvers.plan import Request, smallest_peak, solve
from remat.solvers.simulate import evaluate
from remat.solvers.testing import random_problem


def _record(seed: int) -> tuple[dict, plan_cache.CachedPlan]:
    problem = random_problem(seed, 10, 6)
    low, high = smallest_peak(problem, Request().config).peak_bytes, solve(problem, Request())[1].peak_bytes
    budget = (low + high) // 2
    solution, _ = solve(problem, Request(budget_bytes=budget))
    facts = {name: getattr(solution, name) for name in plan_cache.SOLUTION_FACTS}
    facts["status"], facts["notes"] = solution.status.value, list(solution.notes)
    cached = plan_cache.CachedPlan(problem, solution.saved, solution.recomputed, frozenset(), budget, facts)
    return plan_cache.record_of(cached), cached


@pytest.mark.parametrize("seed", range(4))
def test_a_record_in_another_ranks_names_is_the_same_plan(seed: int) -> None:
    record, cached = _record(seed)
    names = {name: f"r1_{name}" for name in {*cached.problem.step_names, *(v.name for v in cached.problem.values)}}
    moved = plan_cache.plan_of_record(plan_cache.renamed_record(record, names))
    assert moved.saved == {names[n] for n in cached.saved} and moved.recomputed == {names[n] for n in cached.recomputed}
    assert [v.name for v in moved.problem.values] == [names[v.name] for v in cached.problem.values]
    before, after = evaluate(cached.problem, cached.saved), evaluate(moved.problem, moved.saved)
    assert (after.peak_bytes, after.added_seconds) == (before.peak_bytes, before.added_seconds)


def _graph(prefix: str) -> fx.Graph:
    graph = fx.Graph()
    x = graph.placeholder(f"{prefix}x")
    x.meta["val"] = torch.empty(2, 3)
    y = graph.call_function(torch.ops.aten.relu.default, (x,), name=f"{prefix}relu")
    y.meta["val"] = torch.empty(2, 3)
    graph.output(y)
    return graph


def test_fingerprints_name_nodes_by_position_and_records_follow_them() -> None:
    mine, theirs = _graph("a_"), _graph("b_")
    by_position = functools.partial(plan_cache.graph_fingerprint, by_position=True)
    assert by_position(mine) == by_position(theirs)
    assert plan_cache.graph_fingerprint(mine) != plan_cache.graph_fingerprint(theirs)  # the plan cache's is by name
    other = _graph("a_")
    other.find_nodes(op="placeholder")[0].meta["val"] = torch.empty(2, 4)
    assert by_position(other) != by_position(mine)
    with pytest.raises(PlanError, match="rank 0's joint graph has 2 nodes"):
        ranks.in_own_names({}, ["x", "relu"], mine)


def test_rank_0s_errors_are_raised_as_the_same_class_with_the_same_message() -> None:
    budget = BudgetError("too small", budget_bytes=10, min_feasible_bytes=20)
    again = ranks.error_of(ranks.error_record(budget))
    assert isinstance(again, BudgetError) and str(again) == "too small" and again.min_feasible_bytes == 20
    assert isinstance(ranks.error_of(ranks.error_record(GraphError("g"))), GraphError)
    other = ranks.error_of(ranks.error_record(KeyError("k")))
    assert isinstance(other, PlanError) and "rank 0 failed to plan this graph: KeyError" in str(other)


def test_one_process_has_nothing_to_agree_on() -> None:
    assert ranks.world() == (0, 1) and ranks.Agreement.for_graph(_graph("a_"), None) is None
