"""GraphPlan is a record (passes/decide/graph_plan.py): a stage that learns more makes a new one, the
figures computed when read are computed once for every record and report that shares them, and
counting the eager parts measured on the first step leaves the plan it started from as it was."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import remat
from remat.passes.decide.attempt import Attempt, GraphSetting, compile_attempt
from remat.passes.decide.graph_plan import FIGURES, MIN_FEASIBLE, GraphPlan
from remat.passes.decide.partition import Planner
from remat.passes.program.eager_compiler import compile_eager
from remat.passes.scope import eager_parts, rank_scope
from remat.report import report_of
from tests.passes.helpers import Chain, dynamo_graph


@pytest.fixture(scope="module")
def planned() -> tuple[Planner, GraphPlan]:
    """A tiny chain planned op by op, with no budget (so no figure is known yet)."""
    torch.manual_seed(0)
    gm, example = dynamo_graph(Chain(4), torch.randn(256, 32))
    planner = Planner(remat.Options(compiler="eager", plan_cache=False, profile="analytic").request())
    attempt = Attempt(GraphSetting())
    compile_attempt(gm, example, planner, attempt, compile_eager)
    return planner, attempt.plan


def test_a_plan_is_never_changed_once_made(planned) -> None:
    _, plan = planned
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.notes = ("patched",)  # type: ignore[misc]
    noted = plan.noted("a note")
    assert noted is not plan and noted.notes == (*plan.notes, "a note") and "a note" not in plan.notes
    assert noted.noted("a note") is noted  # a note already there is not added twice
    timed = plan.timed("inductor", 1.5)
    assert timed.timings == {**plan.timings, "inductor": 1.5} and "inductor" not in plan.timings


def test_figures_are_computed_once_for_every_record_and_report_that_shares_them(planned, monkeypatch) -> None:
    planner, made = planned
    plan = made.revised()  # (a record of this test's own: the fixture's stays unread)
    assert set(plan.pending) == set(FIGURES)
    solved: list[int] = []
    lowest = plan.lowest
    monkeypatch.setattr(lowest, "fn", lambda fn=lowest.fn: solved.append(1) or fn())
    revised = plan.revised(compile_attempts=3)  # copying computes nothing
    report = report_of(revised)
    assert solved == [] and set(revised.pending) == set(FIGURES) and set(report.pending) == set(FIGURES)
    low = report.min_feasible_bytes  # read on the report: computed on the plan it was built from
    assert solved == [1] and low > 0 and revised.min_feasible_bytes == low
    assert plan.min_feasible_bytes == low and solved == [1]  # and on the record it was revised from, once
    assert not set(MIN_FEASIBLE) & set(report.pending)


def test_counting_the_eager_parts_makes_a_new_plan_and_leaves_the_old_one(planned) -> None:
    planner, made = planned
    plan = made.revised(scope=rank_scope.RankScope(rank_scope.PROCESS))
    raised = eager_parts.raised_by(plan, eager_parts.EagerParts(peak=4096, after=1024, copies=0), planner.lowest_of)
    assert raised is not plan and plan.scope.eager_bytes == 0 and raised.scope.eager_bytes == 4096
    assert raised.problem != plan.problem and raised.solution.saved == plan.solution.saved
    # the window's bytes are in every row from the forward's end: the plan's peak rises, the old one's not
    assert raised.solution.peak_bytes > plan.solution.peak_bytes
    assert raised.lowest is not plan.lowest and set(FIGURES) <= set(raised.pending)
    assert any("measured on the first step" in note for note in raised.notes)
    assert not any("measured on the first step" in note for note in plan.notes)
