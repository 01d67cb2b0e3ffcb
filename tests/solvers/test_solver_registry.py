"""One contract for every registered solver."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from remat.solvers import (
    Problem,
    Solution,
    SolverUnavailable,
    Status,
    available,
    get,
    min_peak,
    names,
    register,
)
from remat.solvers import backends, registry
from remat.solvers.registry import Baseline
from remat.solvers.testing import random_problem
from tests.solvers.test_solver_simulate import naive_timeline

REPO = Path(__file__).resolve().parents[2]


def test_the_expected_solvers_are_registered() -> None:
    assert {"ilp", "ilp-cbc", "store-all", "recompute-all", "greedy"} <= set(names())
    assert set(available()) <= set(names())


def assert_valid(problem: Problem, saved: frozenset[str], recomputed: frozenset[str]) -> None:
    """The plan rules, restated from the Value docstring (not through ``check_plan``)."""
    values = problem.by_name()
    assert not saved & recomputed
    for name in saved:
        assert values[name].is_candidate and values[name].savable, name
    for name in recomputed:
        value = values[name]
        assert value.is_candidate and value.recompute_ban is None, name
        assert all(u in saved or u in recomputed for u in value.operands), name
    assert all(v.name in saved | recomputed for v in problem.candidates() if v.direct_need)


@pytest.mark.parametrize("name", available())
@pytest.mark.parametrize("seed", range(3))
def test_every_solver_returns_a_valid_solution(name: str, seed: int) -> None:
    """At a budget that binds (halfway from the smallest peak to store-all's), each solver's plan
    is valid, and its timeline, peak and added time are what an independent O(T * n) simulation
    of the lifetime rules gives. The ILPs fit the budget; a baseline over it says so."""
    problem = random_problem(seed, 40, 40)
    low, high = min_peak(problem).peak_bytes, get("store-all").solve(problem, None).peak_bytes
    budget = (low + high) // 2
    assert low < budget < high
    solution = get(name).solve(problem, budget)
    assert isinstance(solution, Solution)
    assert_valid(problem, solution.saved, solution.recomputed)
    assert list(solution.timeline) == naive_timeline(problem, set(solution.saved), set(solution.recomputed))
    assert solution.peak_bytes == max(solution.timeline)
    values = problem.by_name()
    expected = sum(values[n].recompute_seconds for n in solution.recomputed) + sum(
        values[n].save_seconds for n in solution.saved)
    assert solution.added_seconds == pytest.approx(expected)
    over = f"over budget: peak {solution.peak_bytes} > {budget}"
    if name.startswith("ilp"):
        assert solution.peak_bytes <= budget and solution.status is Status.OPTIMAL
    else:
        assert solution.status is Status.HEURISTIC
        assert (over in solution.notes) == (solution.peak_bytes > budget)
    if name == "store-all":
        assert solution.peak_bytes == high and over in solution.notes
    assert solution.to_dict()["status"] == solution.status.value


def test_duplicate_registration_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(Baseline("greedy", lambda problem, budget: get("greedy").solve(problem, budget)))


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="registered: ilp, ilp-cbc, store-all"):
        get("no-such-solver")


def test_unavailable_solver_names_the_available_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "backend_available", lambda backend: False)
    with pytest.raises(SolverUnavailable, match="CBC binary.*installed solvers: store-all"):
        get("ilp-cbc")
    with pytest.raises(SolverUnavailable, match="pip install highspy"):
        get("ilp")


def test_baselines_take_no_options() -> None:
    with pytest.raises(TypeError, match="takes no options"):
        get("greedy").solve(random_problem(0, 5, 5), None, time_limit_s=1.0)


def test_ilp_falls_back_to_cbc_loudly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = backends.backend_available
    monkeypatch.setattr(
        registry, "backend_available", lambda backend: backend != "highs" and real(backend)
    )
    with caplog.at_level(logging.WARNING, logger="remat.solvers.registry"):
        solution = get("ilp").solve(random_problem(1, 20, 20), None, time_limit_s=5.0)
    assert solution.solver == "ilp-cbc"
    assert any("solved with cbc" in note for note in solution.notes)
    assert "solved with cbc" in caplog.text


def test_solvers_import_without_torch() -> None:
    code = "import sys, solvers, solvers.testing; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
