"""The model itself: timelines, closure, plan rules."""

from __future__ import annotations

import functools
from dataclasses import replace

import json
import random

import pytest

from remat.solvers import InvalidPlan, Kind, Problem, check_plan, closure, evaluate, timeline
from remat.solvers.model import keep_interval, recompute_interval, start_segments
from remat.solvers.simulate import canonical
from remat.solvers.testing import Node, build_problem, random_problem


def naive_starts(problem: Problem, recomputed: set[str]) -> dict[str, int]:
    """Where each recomputed value is first needed: its first direct read or
    the start of a recomputed user, whichever is first (by recursion)."""
    by_name = problem.by_name()

    @functools.cache
    def start(name: str) -> int:
        v = by_name[name]
        times = [v.direct_start] if v.direct_start is not None else []
        times += [start(w.name) for w in problem.values if w.name in recomputed and name in w.operands]
        return min(times)

    return {name: start(name) for name in recomputed}


def naive_timeline(problem: Problem, saved: set[str], recomputed: set[str]) -> list[int]:
    """O(T * n), straight from the lifetime rules."""
    starts = naive_starts(problem, recomputed)
    out = []
    for t in range(problem.num_steps):
        total = max([problem.workspace_at(t), *(scratch for v, scratch in recompute_scratch(problem, recomputed, starts, t))])
        for v in problem.values:
            alive = v.kind is Kind.INPUT or v.produced <= t <= v.last_use
            if v.name in saved and v.need_end is not None:
                alive = alive or v.last_use < t <= v.need_end
            if v.name in recomputed:
                alive = alive or starts[v.name] <= t <= v.need_end
            total += v.bytes if alive else 0
        out.append(total)
    return out


def recompute_scratch(problem: Problem, recomputed: set[str], starts: dict[str, int], t: int) -> list:
    """Recomputed values whose op's scratch counts at step ``t``: at their start, and at each
    later step where a recompute of theirs could begin (their first read, a user's possible start)."""
    segments = start_segments(problem)
    return [(v, problem.workspace_at(v.produced) if v.held_when_recomputed else 0) for v in problem.values
            if v.name in recomputed
            and (t == starts[v.name] or (t > starts[v.name] and (t == segments[v.name].read or t in segments[v.name].bounds)))]


def test_recomputed_op_scratch_counts_at_its_start() -> None:
    """x -> a (op scratch 50) -> b; the backward reads a late: recomputing a needs its scratch
    again there, beside what is alive."""
    problem = build_problem([("x", 10)], [Node("a", 20, ("x",)), Node("b", 30, ("a",), output=True)],
                            [Node("g1", 5), Node("g2", 5), Node("g3", 5, ("a",), grad=True)], workspace=[50, 0, 0, 0, 0])
    kept, again = timeline(problem, {"a"}, set()), timeline(problem, set(), {"a"})
    assert kept == (80, 60, 65, 65, 65)
    assert again == (80, 60, 45, 45, 115)  # at g3: x, b, g3, a again, and a's scratch 50 again
    assert list(again) == naive_timeline(problem, set(), {"a"})


def test_a_recompute_fused_into_its_consumers_holds_no_scratch() -> None:
    problem = build_problem([("x", 10)], [Node("a", 20, ("x",)), Node("b", 30, ("a",), output=True)],
                            [Node("g1", 5), Node("g2", 5), Node("g3", 5, ("a",), grad=True)], workspace=[50, 0, 0, 0, 0])
    fused = replace(problem, values=tuple(replace(v, recompute_bytes=0) if v.name == "a" else v for v in problem.values))
    assert timeline(fused, set(), {"a"})[-1] == 45  # x, b, g3: neither a's bytes nor its scratch again


def test_chain_store_all_timeline(chain: Problem) -> None:
    assert timeline(chain, {"a", "b", "c"}, set()) == (110, 210, 310, 320, 220, 120)


def test_branch_intervals(branch: Problem) -> None:
    b = branch.by_name()["b"]
    assert (b.last_use, b.need_start, b.need_end) == (2, 4, 4)
    assert keep_interval(b) == (3, 4)
    assert recompute_interval(b) == (4, 4)
    assert timeline(branch, {"a"}, {"b"}) == (110, 210, 220, 320, 230, 130)


def test_closure_follows_unsaved_operands(branch: Problem) -> None:
    assert closure(branch, {"a", "b"}) == frozenset()
    assert closure(branch, {"a"}) == {"b"}
    assert closure(branch, set()) == {"a", "b"}


def test_view_closure_recomputes_the_view(view: Problem) -> None:
    assert closure(view, {"a"}) == {"v"}
    assert evaluate(view, {"a"}).recomputed == {"v"}


@pytest.mark.parametrize(
    ("saved", "recomputed", "message"),
    [
        ({"v"}, {"a"}, "v is saved but unsavable"),
        ({"a"}, set(), "v is needed by the backward"),
        (set(), {"v"}, "operand a is neither saved nor recomputed"),
        ({"a"}, {"a", "v"}, "a is both saved and recomputed"),
        ({"a", "x"}, {"v"}, "x is not a candidate"),
    ],
)
def test_check_plan_names_the_broken_rule(
    view: Problem, saved: set[str], recomputed: set[str], message: str
) -> None:
    with pytest.raises(InvalidPlan, match=message):
        check_plan(view, saved, recomputed)


def test_banned_value_may_not_be_recomputed(make_branch) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidPlan, match=r"b is recomputed but banned \(random op\)"):
        evaluate(make_branch(ban_b=True), {"a"})


def test_canonical_drops_values_nothing_needs(branch: Problem) -> None:
    assert canonical(branch, {"a", "b"}) == {"a", "b"}
    problem = random_problem(3, 12, 8)
    everything = {v.name for v in problem.candidates() if v.savable}
    kept = canonical(problem, everything)
    assert kept == {v.name for v in problem.candidates() if v.savable and v.direct_need}


@pytest.mark.parametrize("seed", range(20))
def test_timeline_matches_naive(seed: int) -> None:
    problem = random_problem(seed, 15, 15)
    rng = random.Random(seed)
    savable = [v.name for v in problem.candidates() if v.savable]
    for _ in range(5):
        saved = {n for n in savable if rng.random() < 0.5}
        recomputed = set(closure(problem, saved))
        assert list(timeline(problem, saved, recomputed)) == naive_timeline(problem, saved, recomputed)


def test_evaluate_fills_every_field(branch: Problem) -> None:
    solution = evaluate(branch, {"a"}, solver="mine")
    assert solution.recomputed == {"b"}
    assert solution.peak_bytes == max(solution.timeline) == 320
    assert solution.added_seconds == pytest.approx(0.1)
    data = json.loads(json.dumps(solution.to_dict()))
    assert data["saved"] == ["a"] and data["status"] == "heuristic" and data["solver"] == "mine"
