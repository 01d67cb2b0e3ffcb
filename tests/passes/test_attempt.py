"""One compile, one attempt (passes/decide/attempt.py): each compile of a captured graph asks the planner
through its own Attempt, gets its own plan, and leaves nothing on the planner for the next."""

from __future__ import annotations

import pytest
import torch

import remat
from remat.passes.decide.attempt import Attempt, CompileStopped, GraphSetting, compile_attempt
from remat.passes.program.eager_compiler import compile_eager
from remat.passes.decide.partition import Planner
from remat.solvers.baselines import store_all
from tests.passes.helpers import Chain, dynamo_graph


@pytest.fixture(scope="module")
def captured() -> tuple:
    """The dynamo graph of a six-layer Chain and its example inputs (nothing planned)."""
    torch.manual_seed(0)
    model, x = Chain(6), torch.randn(1024, 32)
    gm, example = dynamo_graph(model, x)
    return model, x, gm, example


def planner() -> Planner:
    # a budget so that a target below store-all binds; analytic costs: every attempt plans from equal costs
    return Planner(remat.Options(compiler="eager", plan_cache=False, profile="analytic", budget_gb=1.0).request())


def test_each_compile_gets_its_own_plan_and_the_planner_keeps_none(captured) -> None:
    _, _, gm, example = captured
    shared = planner()
    loose, tight = Attempt(GraphSetting()), Attempt(GraphSetting(), target=0, settle_for_lowest=True)
    compile_attempt(gm, example, shared, loose, compile_eager)
    compile_attempt(gm, example, shared, tight, compile_eager)
    assert loose.plan is not None and tight.plan is not None and loose.plan is not tight.plan
    assert tight.plan.solution.peak_bytes < loose.plan.solution.peak_bytes  # the budget does not bind the first
    assert tight.plan.solution.peak_bytes == tight.plan.lowest().peak_bytes  # below every plan: the smallest
    # the planner holds what compiles share, nothing of one compile
    assert not {"plans", "target", "replay", "wanted", "scope", "given"} & set(vars(shared))


def test_a_backward_compiled_later_is_checked_against_its_own_attempt(captured) -> None:
    """Op by op the backward is compiled at its first call, here after another attempt compiled the
    same graph with another plan: it is checked against the attempt that compiled its forward."""
    _, _, gm, example = captured
    shared = planner()
    first, second = Attempt(GraphSetting(), target=0, settle_for_lowest=True), Attempt(GraphSetting())
    compiled = compile_attempt(gm, example, shared, first, compile_eager)
    compile_attempt(gm, example, shared, second, compile_eager)
    assert not first.plan.complete and second.plan.solution.saved != first.plan.solution.saved
    out = compiled(*[t.detach().requires_grad_(t.requires_grad) for t in example])
    (out[0] if isinstance(out, (list, tuple)) else out).backward()
    assert first.plan.complete and not second.plan.complete
    assert first.plan.realized_peak_bytes <= first.plan.solution.peak_bytes  # checked: not above the plan


def test_an_unwanted_plan_stops_the_compile_at_the_partitioner(captured) -> None:
    _, _, gm, example = captured
    turned_down = Attempt(GraphSetting(), wanted=lambda plan: False)
    with pytest.raises(CompileStopped):
        compile_attempt(gm, example, planner(), turned_down, compile_eager)
    assert turned_down.stopped == "unwanted"
    assert turned_down.plan is not None and not turned_down.graphs  # planned, nothing partitioned


def test_a_program_expected_whole_stops_at_the_partitioner(captured) -> None:
    _, _, gm, example = captured
    expected = Attempt(GraphSetting(), expect_program=True)
    with pytest.raises(CompileStopped):
        compile_attempt(gm, example, planner(), expected, compile_eager)
    assert expected.stopped == "program miss" and expected.plan is None


def test_a_replayed_plan_is_handed_out_again_without_planning(captured, monkeypatch) -> None:
    _, _, gm, example = captured
    shared = planner()
    made = Attempt(GraphSetting(), target=0, settle_for_lowest=True)
    compile_attempt(gm, example, shared, made, compile_eager)
    monkeypatch.setattr(Planner, "local_plan", lambda *args: pytest.fail("planned again"))
    again = Attempt(GraphSetting(), replay=made.plan)
    compile_attempt(gm, example, shared, again, compile_eager)
    # the same plan, as a record of its own whose graphs are checked anew
    assert again.plan.solution is made.plan.solution and again.plan.realized is not made.plan.realized
    assert "forward" in again.graphs and not made.graphs.get("backward")
    assert store_all(made.plan.problem).peak_bytes > made.plan.solution.peak_bytes
