"""Issue 12: work nobody asked for is not done. The smallest-peak solve, torch's min-cut
decision and the compiles behind the exact smallest feasible budget run only when a
figure that needs them is read, once; a sweep solves the smallest peak once."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch

import remat
from remat import zoo
from remat.errors import GIB
from remat.frontier import capture
from remat.passes.program import fit
from remat.passes.decide import graph_plan, partition
from remat.passes import torch_adapter as adapter
from remat.solvers import plan as policy
from tests.conftest import build

TINY = {"layers": 1, "d_model": 32, "heads": 4, "seq": 16, "vocab": 64, "batch": 4}


class Calls:
    """Counts the calls of module attributes, passing each through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **targets: tuple[object, str]) -> None:
        self.count = dict.fromkeys(targets, 0)
        for key, (module, name) in targets.items():
            real = getattr(module, name)
            monkeypatch.setattr(module, name, self.counted(key, real))

    def counted(self, key: str, real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.count[key] += 1
            return real(*args, **kwargs)

        return call


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch, solve=(policy, "smallest_peak"), min_cut=(adapter, "min_cut_saved_values"),
                 compile=(fit, "compile_once"))


@pytest.fixture(scope="module")
def gpt() -> tuple[torch.nn.Module, tuple]:
    return build("gpt")


@pytest.fixture(scope="module")
def store_all_gb(gpt) -> float:  # type: ignore[no-untyped-def]
    model, inputs = gpt
    return remat.plan(model, *inputs, compiler="eager").unbinding_budget_bytes / GIB


@pytest.mark.parametrize("budget", ["none", "inf", "twice store-all"])
def test_an_unbinding_plan_solves_no_smallest_peak_until_it_is_read(gpt, store_all_gb: float, calls: Calls,
                                                                    budget: str) -> None:
    model, inputs = gpt
    budget_gb = {"none": None, "inf": float("inf"), "twice store-all": 2 * store_all_gb}[budget]
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=budget_gb)
    assert calls.count == {"solve": 0, "min_cut": 0, "compile": 0}
    assert set(report.pending) == set(graph_plan.FIGURES)
    low = report.min_feasible_bytes
    assert calls.count["solve"] == 1 and calls.count["min_cut"] == 0
    assert report.min_feasible_exact and report.min_feasible_bytes == low and calls.count["solve"] == 1
    assert report.min_cut_peak_bytes is not None and report.min_cut_overhead_seconds is not None
    assert report.peer_rules  # scored by the simulator: no solve, no torch
    assert calls.count == {"solve": 1, "min_cut": 1, "compile": 0} and report.pending == []


def test_a_binding_budget_the_ilp_fits_asks_torch_once_and_the_smallest_peak_when_read(
        gpt, store_all_gb: float, calls: Calls) -> None:
    """A binding budget needs torch's min-cut plan (a candidate: remat's plan is never slower
    than it under the model), made once; the ILP's plan proves the budget feasible, so the
    smallest peak is solved only when read."""
    model, inputs = gpt
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=0.9 * store_all_gb)
    assert calls.count["solve"] == 0 and calls.count["min_cut"] == 1
    assert "min_feasible_bytes" in report.pending
    assert report.min_feasible_bytes < report.budget_bytes and calls.count["solve"] == 1
    fits = report.min_cut_peak_bytes is not None and report.min_cut_peak_bytes <= report.budget_bytes
    assert not fits or report.predicted_overhead_seconds <= report.min_cut_overhead_seconds + 1e-12
    assert calls.count["min_cut"] == 1
    assert set(report.peer_rules) == {"checkpoint-blocks", "save-matmuls"}
    for rule in report.peer_rules.values():  # each rule that fits is a plan the solve had: never faster
        fits = rule["peak_bytes"] <= report.budget_bytes
        assert not fits or report.predicted_overhead_seconds <= rule["overhead_seconds"] + 1e-12


def test_every_figure_is_in_the_dict(gpt) -> None:  # type: ignore[no-untyped-def]
    model, inputs = gpt
    report = remat.plan(model, *inputs, compiler="eager")
    data = json.loads(report.to_json())
    assert data["min_feasible_bytes"] > 0 and data["min_cut_peak_bytes"] > 0 and report.pending == []
    assert data["peer_rules"]["checkpoint-blocks"]["peak_bytes"] < report.store_all_peak_bytes
    assert "checkpoint per block" in report.summary() and "save matmuls" in report.summary()


def test_a_sweep_solves_the_smallest_peak_once(gpt, calls: Calls) -> None:  # type: ignore[no-untyped-def]
    model, inputs = gpt
    frontier = remat.sweep(model, *inputs, points=5, compiler="eager")
    assert len(frontier.rows) == 5 and all(r["feasible"] for r in frontier.rows)
    assert calls.count["solve"] == 1 and calls.count["min_cut"] == 0
    assert {r.min_feasible_bytes for r in frontier.reports} == {frontier.min_feasible_bytes}
    assert len({r.min_cut_peak_bytes for r in frontier.reports}) == 1
    assert calls.count["solve"] == 1 and calls.count["min_cut"] == 1


def test_a_sweep_of_unbinding_budgets_solves_no_smallest_peak(gpt, store_all_gb: float,
                                                              calls: Calls) -> None:
    model, inputs = gpt
    frontier = remat.sweep(model, *inputs, budgets=[store_all_gb, 2 * store_all_gb], compiler="eager")
    assert [r["feasible"] for r in frontier.rows] == [True, True] and calls.count["solve"] == 0
    assert frontier.min_feasible_bytes <= frontier.rows[0]["predicted_peak_bytes"] and calls.count["solve"] == 1


def test_plan_under_inductor_compiles_once_and_the_exact_minimum_when_read(calls: Calls) -> None:
    model, inputs = zoo.build("gpt", **TINY)
    report = remat.plan(model, *inputs, plan_cache=False)
    assert report.compiled_peak_bytes is not None and report.compile_attempts == 1
    assert calls.count == {"solve": 0, "min_cut": 0, "compile": 1}
    # rendering computes nothing: a figure not computed yet says so
    summary, _ = report.summary(), report._repr_html_()
    assert calls.count == {"solve": 0, "min_cut": 0, "compile": 1} and "min_feasible_bytes" in report.pending
    assert "not computed (read report.min_feasible_bytes" in summary
    assert summary.splitlines()[0].startswith("no budget: the fastest plan, peak ") and "(compiled program)" in summary
    torch._dynamo.reset()  # the figure is compiled outside the capture that planned it
    assert report.min_feasible_exact and report.min_feasible_bytes <= report.compiled_peak_bytes
    assert calls.count["compile"] in (1, 2) and calls.count["solve"] == 1  # 1: the fastest plan is the smallest


def test_the_plan_cache_stores_unread_figures_as_pending_and_a_hit_computes_them(
        tmp_path: pathlib.Path, gpt, calls: Calls) -> None:  # type: ignore[no-untyped-def]
    model, inputs = gpt
    first = remat.plan(model, *inputs, compiler="eager", plan_cache=str(tmp_path))
    (path,) = tmp_path.glob("*.json")
    entry = json.loads(path.read_text())
    assert first.pending and not set(first.pending) & set(entry["figures"])  # unread: not stored
    torch._dynamo.reset()
    again = remat.plan(model, *inputs, compiler="eager", plan_cache=str(tmp_path))
    assert again.plan_cache == "hit" and calls.count["solve"] == 0
    assert again.min_feasible_bytes == first.min_feasible_bytes
    assert again.min_cut_peak_bytes == first.min_cut_peak_bytes


def test_equal_problems_share_one_smallest_peak_solve(gpt, calls: Calls) -> None:  # type: ignore[no-untyped-def]
    """The fitting loop plans one graph several times, each time from an equal problem."""
    model, inputs = gpt
    problem = capture(model, inputs, remat.Options(compiler="eager")).problem
    planner = partition.Planner(remat.Options(compiler="eager", plan_cache=False).request())
    first, again = planner.lowest_of(problem)(), planner.lowest_of(dataclasses.replace(problem))()
    assert again is first and calls.count["solve"] == 1


def test_a_later_compile_sees_the_grad_mode_and_autocast_of_the_plan() -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        restore = adapter.ambient_state()
    with torch.no_grad(), restore():
        assert torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    restore = adapter.ambient_state()
    with torch.autocast("cpu", dtype=torch.bfloat16), restore():
        assert not torch.is_autocast_enabled("cpu")
