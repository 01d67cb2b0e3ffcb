"""Solver faults: a missing solver is named, a failing one falls back loudly, never over budget."""

from __future__ import annotations

import subprocess
import sys

import pytest

import remat
from remat.solvers import ilp, registry
from tests.conftest import budget_between, build, planned

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpt_budget() -> float:
    return budget_between(planned("gpt", "eager"), 0.9)  # a cheap plan fits


def test_a_requested_solver_that_is_missing_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "backend_available", lambda backend: backend != "cbc")
    model, _ = build("gpt")
    with pytest.raises(remat.SolverUnavailable, match=r"'ilp-cbc' cannot run here \(no CBC binary.*"
                                                      r"installed solvers: ilp, store-all"):
        remat.compile(model, budget_gb=1, solver="ilp-cbc")


def test_without_highspy_the_default_solver_is_cbc_and_the_report_says_so() -> None:
    code = (
        "import sys; sys.modules['highspy'] = None\n"  # as if highspy were not installed
        "import remat\n"
        "from tests.conftest import build\n"
        "model, inputs = build('gpt')\n"
        "low = remat.plan(model, *inputs, compiler='eager').min_feasible_bytes\n"
        "r = remat.plan(model, *inputs, compiler='eager', budget_gb=1.2 * low / 2**30)\n"
        "print(r.solver, r.solver_status, '|', ' '.join(r.notes))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ilp-cbc optimal") and "highs unavailable (is highspy installed?)" in line


def test_a_time_limit_gives_the_best_plan_found_with_its_status_and_gap() -> None:
    model, inputs = build("gpt", layers=6)
    budget = budget_between(planned("gpt", "eager", layers=6), 1.0)  # the store-all seed fits
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=budget, time_limit_s=1e-3)
    assert report.predicted_peak_bytes <= report.planned_budget_bytes
    assert report.solver_status in ("feasible", "optimal")
    if report.solver_status == "feasible":  # 1 ms is too short for 6 layers on any machine we know
        assert report.mip_gap is not None and any("time limit of 0.001 s reached" in n for n in report.notes)


def test_a_time_limited_minimum_says_it_may_not_be_the_minimum() -> None:
    model, inputs = build("gpt", layers=6)
    low = planned("gpt", "eager", layers=6).min_feasible_bytes
    with pytest.raises(remat.BudgetError, match="smallest budget found feasible.*longer time_limit_s"):
        remat.plan(model, *inputs, compiler="eager", budget_gb=low / 2**30, time_limit_s=1e-3)


def _crash(*args: object, **kwargs: object) -> None:
    raise RuntimeError("solver library crashed")


def test_a_crashing_solver_gives_a_cheap_plan_within_budget_noted(
        gpt_budget: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "solve_ilp", _crash)
    model, inputs = build("gpt")
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=gpt_budget)
    assert report.solver_status == "fallback" and report.predicted_peak_bytes <= report.planned_budget_bytes
    assert any("solver 'ilp' failed (RuntimeError: solver library crashed); used the" in n for n in report.notes)
    assert "fallback" in report.summary()


def test_a_crashing_solver_at_a_tight_budget_falls_back_to_the_smallest_peak_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, inputs = build("gpt")
    budget = budget_between(planned("gpt", "eager"), 0.05)  # no cheap plan gets here
    monkeypatch.setattr(registry, "solve_ilp", _crash)
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=budget)
    assert report.solver_status == "fallback" and report.predicted_peak_bytes <= report.planned_budget_bytes
    assert any("solver library crashed" in n and "used the ilp-highs plan" in n for n in report.notes)


def test_when_every_ilp_crashes_the_minimum_is_a_noted_bound_and_nothing_exceeds_the_budget(
        gpt_budget: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "solve_ilp", _crash)
    monkeypatch.setattr(ilp, "solve_ilp", _crash)
    model, inputs = build("gpt")
    try:
        report = remat.plan(model, *inputs, compiler="eager", budget_gb=gpt_budget)
    except remat.BudgetError as exc:  # the cheap plans' minimum is above this budget: said, not exceeded
        assert "smallest budget found feasible" in str(exc) and "stopped early" in str(exc)
        return
    except remat.PlanError as exc:
        assert "no cheap plan fits" in str(exc)
        return
    assert report.predicted_peak_bytes <= report.planned_budget_bytes and report.solver_status == "fallback"
