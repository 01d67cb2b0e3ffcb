"""store-all, recompute-all, greedy, the peers' rules: exact answers and invariants."""

from __future__ import annotations

import time

import pytest

from remat.solvers import (InvalidPlan, Problem, Status, check_plan, checkpoint_blocks, greedy, recompute_all,
                           store_all)
from remat.solvers.plan import peer_rules
from remat.solvers.testing import Node, build_problem, random_problem


def test_store_all_keeps_what_the_backward_reads(branch: Problem) -> None:
    plan = store_all(branch)
    assert (plan.saved, plan.recomputed, plan.peak_bytes) == ({"a", "b"}, set(), 420)
    assert plan.status is Status.HEURISTIC and plan.solver == "store-all"


def test_store_all_recomputes_a_view_from_its_kept_base(view: Problem) -> None:
    plan = store_all(view)
    assert (plan.saved, plan.recomputed, plan.peak_bytes) == ({"a"}, {"v"}, 320)


def test_recompute_all_keeps_only_banned(make_branch) -> None:  # type: ignore[no-untyped-def]
    assert recompute_all(make_branch()).saved == frozenset()
    plan = recompute_all(make_branch(ban_b=True))
    assert (plan.saved, plan.recomputed) == ({"b"}, {"a"})
    assert plan.added_seconds == pytest.approx(5.0)


def test_recompute_all_rejects_a_banned_view() -> None:
    forward = [Node("a", 8, ("x",)), Node("v", reads=("a",), view=True, ban="mutation")]
    problem = build_problem([("x", 1)], forward, [Node("g", 1, ("v",))])
    with pytest.raises(InvalidPlan, match="v can be neither kept"):
        recompute_all(problem)


def two_blocks(*, view_output: bool = False, blocks: tuple[str, str] = ("layers.0", "layers.1")) -> Problem:
    """x -> [a -> b] -> [c -> d] -> loss; block 0's output is ``b`` (or its view ``bv``)."""
    out = "bv" if view_output else "b"
    forward = [Node("a", 10, ("x",), block=blocks[0]), Node("b", 20, ("a",), block=blocks[0]),
               *([Node("bv", reads=("b",), view=True, block=blocks[1])] if view_output else []),
               Node("c", 30, (out,), block=blocks[1]), Node("d", 40, ("c",), block=blocks[1]),
               Node("loss", 1, ("d",), output=True)]
    backward = [Node("gd", 40, ("loss", "d")), Node("gc", 30, ("gd", "c")), Node("gb", 20, ("gc", out)),
                Node("ga", 10, ("gb", "a")), Node("gx", 1, ("ga",), grad=True)]
    return build_problem([("x", 5)], forward, backward)


def test_checkpoint_blocks_keeps_each_blocks_output_and_recomputes_its_inside() -> None:
    plan = checkpoint_blocks(two_blocks())
    assert (plan.saved, plan.recomputed, plan.solver) == ({"b", "d", "loss"}, {"a", "c"}, "checkpoint-blocks")
    assert plan.peak_bytes < store_all(two_blocks()).peak_bytes


def test_checkpoint_blocks_keeps_the_base_of_a_view_that_crosses_blocks() -> None:
    plan = checkpoint_blocks(two_blocks(view_output=True))
    assert (plan.saved, plan.recomputed) == ({"b", "d", "loss"}, {"a", "bv", "c"})


def test_peer_rules_score_each_rule_against_store_all() -> None:
    problem = two_blocks()
    base = store_all(problem).added_seconds
    rules = peer_rules(problem)
    assert rules["checkpoint-blocks"] == {"peak_bytes": checkpoint_blocks(problem).peak_bytes,
                                          "overhead_seconds": checkpoint_blocks(problem).added_seconds - base}
    assert set(rules) == {"checkpoint-blocks", "save-matmuls"}
    assert set(peer_rules(two_blocks(blocks=("", "")))) == {"save-matmuls"}  # no blocks: no such rule


def test_checkpoint_blocks_without_blocks_is_store_all() -> None:
    problem = two_blocks(blocks=("", ""))
    assert checkpoint_blocks(problem).saved == store_all(problem).saved


def test_greedy_recomputes_the_cheap_value_first(branch: Problem) -> None:
    plan = greedy(branch, 350)
    assert (plan.saved, plan.recomputed, plan.peak_bytes) == ({"a"}, {"b"}, 320)
    assert greedy(branch, None).saved == store_all(branch).saved


def test_greedy_notes_a_budget_it_cannot_reach(branch: Problem) -> None:
    plan = greedy(branch, 100)
    assert plan.peak_bytes > 100
    assert any("over budget" in note for note in plan.notes)


@pytest.mark.parametrize("seed", range(15))
def test_baselines_are_valid_and_greedy_never_raises_the_peak(seed: int) -> None:
    problem = random_problem(seed, 30, 30)
    keep_all = store_all(problem)
    for plan in (keep_all, recompute_all(problem), greedy(problem, 0), checkpoint_blocks(problem)):
        check_plan(problem, plan.saved, plan.recomputed)
        assert plan.peak_bytes == max(plan.timeline)
    assert greedy(problem, 0).peak_bytes <= keep_all.peak_bytes


def test_greedy_is_fast_on_two_thousand_values() -> None:
    problem = random_problem(7, 2000, 2000)
    start = time.perf_counter()
    plan = greedy(problem, 0)
    assert time.perf_counter() - start < 10.0
    assert plan.peak_bytes <= store_all(problem).peak_bytes
