"""One contract for every registered solver."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from remat.solvers import (
    Solution,
    SolverUnavailable,
    Status,
    available,
    check_plan,
    get,
    names,
    register,
    timeline,
)
from remat.solvers import backends, registry
from remat.solvers.registry import Baseline
from remat.solvers.simulate import added_seconds
from remat.solvers.testing import random_problem

REPO = Path(__file__).resolve().parents[2]


def test_the_expected_solvers_are_registered() -> None:
    assert {"ilp", "ilp-cbc", "store-all", "recompute-all", "greedy"} <= set(names())
    assert set(available()) <= set(names())


@pytest.mark.parametrize("name", available())
@pytest.mark.parametrize("seed", range(3))
def test_every_solver_returns_a_valid_solution(name: str, seed: int) -> None:
    problem = random_problem(seed, 40, 40)
    budget = 2 * get("store-all").solve(problem, None).peak_bytes
    solution = get(name).solve(problem, budget)
    assert isinstance(solution, Solution)
    check_plan(problem, solution.saved, solution.recomputed)
    assert solution.timeline == timeline(problem, solution.saved, solution.recomputed)
    assert solution.peak_bytes == max(solution.timeline) <= budget
    expected = added_seconds(problem, solution.saved, solution.recomputed)
    assert solution.added_seconds == pytest.approx(expected)
    assert solution.status in (Status.OPTIMAL, Status.HEURISTIC)
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
