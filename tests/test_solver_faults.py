"""Solver faults: a missing solver is named, a failing one falls back loudly, never over budget."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import remat
from remat import solvers
from remat.errors import format_bytes
from remat.solvers.lazy import Once
from remat.solvers.plan import Request, solve_or_fall_back
from remat.solvers import ilp, registry
from remat.solvers.solution import Status
from tests.conftest import budget_between, build, planned
from tests.solvers.conftest import chain_problem

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


def _time_limited(monkeypatch: pytest.MonkeyPatch, gap: float = 0.25) -> None:
    """Every ILP solve stops as at a time limit: its incumbent, status FEASIBLE, the given gap."""
    real = ilp.run_backend

    def run(prob, config):  # type: ignore[no-untyped-def]
        outcome = real(prob, config)
        assert outcome.status is not None, outcome.reason
        return dataclasses.replace(outcome, status=Status.FEASIBLE, gap=gap)

    monkeypatch.setattr(ilp, "run_backend", run)


def test_a_time_limit_gives_the_best_plan_found_with_its_status_and_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    model, inputs = build("gpt")
    budget = budget_between(planned("gpt", "eager"), 0.5)
    _time_limited(monkeypatch, gap=0.25)
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=budget, time_limit_s=5)
    assert report.solver == "ilp-highs" and report.solver_status == "feasible" and report.mip_gap == 0.25
    assert ("time limit of 5 s reached: the best plan found (gap to optimal 25.00%); "
            "raise time_limit_s for a faster one") in report.notes
    assert report.predicted_peak_bytes <= report.planned_budget_bytes == report.budget_bytes


def test_a_time_limited_minimum_says_it_may_not_be_the_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """One byte below the smallest feasible budget: a proven minimum is named as the smallest
    feasible budget; a time-limited one as the smallest found, with the advice to search longer."""
    model, inputs = build("gpt")
    low = planned("gpt", "eager").min_feasible_bytes
    below = (low - 1) / 2**30  # dividing by a power of two is exact: budget_bytes is low - 1
    with pytest.raises(remat.BudgetError) as proven:
        remat.plan(model, *inputs, compiler="eager", budget_gb=below)
    assert "below the smallest feasible budget" in str(proven.value) and "stopped early" not in str(proven.value)
    assert (proven.value.budget_bytes, proven.value.min_feasible_bytes) == (low - 1, low)
    _time_limited(monkeypatch)
    with pytest.raises(remat.BudgetError) as found:
        remat.plan(model, *inputs, compiler="eager", budget_gb=below)
    assert "below the smallest budget found feasible" in str(found.value)
    assert ("The search for the minimum stopped early (feasible): a longer time_limit_s may find a lower one."
            in str(found.value))


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


def _every_ilp_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "solve_ilp", _crash)
    monkeypatch.setattr(ilp, "solve_ilp", _crash)


@pytest.fixture(scope="module")
def cheap_minimum() -> tuple[int, int]:
    """With every ILP crashing, the smallest feasible budget remat names is the lowest cheap
    plan's peak (an upper bound); with store-all's peak, for the GPT model."""
    model, inputs = build("gpt")
    with pytest.MonkeyPatch.context() as patch:
        _every_ilp_crashes(patch)
        report = remat.plan(model, *inputs, compiler="eager")
        bound = report.min_feasible_bytes
    assert report.min_feasible_exact and bound < report.store_all_peak_bytes  # a budget there binds
    return bound, report.store_all_peak_bytes


def test_when_every_ilp_crashes_a_budget_at_the_cheap_minimum_gets_a_noted_fallback(
        cheap_minimum: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    bound, store_all = cheap_minimum
    _every_ilp_crashes(monkeypatch)
    model, inputs = build("gpt")
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=bound / 2**30)
    assert report.budget_bytes == bound and report.store_all_peak_bytes == store_all
    assert report.solver_status == "fallback" and report.predicted_peak_bytes <= bound
    assert any(n.startswith("solver 'ilp' failed (RuntimeError: solver library crashed); used the ")
               for n in report.notes)


def test_when_every_ilp_crashes_a_budget_below_the_cheap_minimum_names_it_as_a_bound(
        cheap_minimum: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    bound, _ = cheap_minimum
    _every_ilp_crashes(monkeypatch)
    model, inputs = build("gpt")
    with pytest.raises(remat.BudgetError) as caught:
        remat.plan(model, *inputs, compiler="eager", budget_gb=(bound - 1) / 2**30)
    assert (caught.value.budget_bytes, caught.value.min_feasible_bytes) == (bound - 1, bound)
    assert "below the smallest budget found feasible" in str(caught.value)
    assert "The search for the minimum stopped early (fallback)" in str(caught.value)


def test_a_solver_plan_over_the_budget_is_replaced_by_one_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ILP hands back store-all's plan, over a budget halfway to store-all: never used."""
    model, inputs = build("gpt")
    budget = budget_between(planned("gpt", "eager"), 0.5)  # before the patch: planned() is shared
    monkeypatch.setattr(registry, "solve_ilp", lambda problem, _budget, **kwargs: solvers.store_all(problem))
    report = remat.plan(model, *inputs, compiler="eager", budget_gb=budget)
    cap, peak = report.planned_budget_bytes, report.store_all_peak_bytes
    assert peak > cap and report.solver_status == "fallback" and report.predicted_peak_bytes <= cap
    assert any(n.startswith(f"solver 'ilp' found no plan within {format_bytes(cap)} (its plan peaks at "
                            f"{format_bytes(peak)}); used the ") for n in report.notes)


def test_when_no_plan_fits_the_cap_the_fall_back_raises_plan_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``solve_or_fall_back`` itself, below every plan's peak (``solve`` raises BudgetError before
    it gets there): chain_problem peaks at 220 B at the least; the cap is 100 B."""
    problem, request = chain_problem(), Request(solver="ilp")
    lowest = Once(lambda: solvers.min_peak(problem))
    assert lowest().peak_bytes == 220
    monkeypatch.setattr(registry, "solve_ilp", _crash)
    with pytest.raises(remat.PlanError, match=r"^solver 'ilp' failed \(RuntimeError: solver library crashed\), "
                                              r"and no cheap plan fits 100 B: raise the budget"):
        solve_or_fall_back(problem, 100, request, lowest)
