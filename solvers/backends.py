"""Running a PuLP problem on HiGHS or CBC and reading back what happened.

Kept apart from ilp.py so the model reads like the formulation; everything
solver-specific (warm starts, status codes, dual bounds) lives here.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulp

from .solution import Status

if TYPE_CHECKING:
    from .ilp import ILPConfig

log = logging.getLogger(__name__)

BACKENDS = ("highs", "cbc")
# HiGHS runs its RINS and RENS sub-MIP heuristics at the root of every solve. Every solve here
# starts from a valid plan (the seed), and on remat's programs they took most of the root's time
# without finding a better one than the search did: the smallest-peak solve of a 2-layer GPT took
# 7.5 s with them and 1.5 s without, and plans stayed the same within the MIP gap
# (bench/results/2026-12-07-cpu-highs-sub-mip.md). An older HiGHS without these options ignores them.
HIGHS_OPTIONS = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False}


@dataclass(frozen=True)
class Outcome:
    """What a solve produced: ``status`` is None when no integral plan came back."""

    status: Status | None
    infeasible: bool = False
    reason: str = ""
    dual_bound: float | None = None  # in the model's objective units
    gap: float | None = None


class WarmHiGHS(pulp.HiGHS):  # type: ignore[misc, valid-type]
    """pulp.HiGHS that passes the variables' initial values to HiGHS as a MIP
    start; PuLP's HiGHS API ignores them (it has no warmStart option)."""

    def __init__(self, *, mip_start: bool = True, **options: Any) -> None:
        super().__init__(**options)
        self.mip_start = mip_start

    def callSolver(self, lp: pulp.LpProblem) -> None:
        start = [(var.index, var.varValue) for var in lp.variables() if var.varValue is not None]
        if self.mip_start and start:
            index, value = zip(*start)
            lp.solverModel.setSolution(len(index), list(index), list(value))
        super().callSolver(lp)


def _start_echoed(prob: pulp.LpProblem) -> bool:
    """Whether HiGHS handed back its MIP start instead of its own solution.

    HiGHS 1.16 does this when presolve maps the start to a better point in
    the reduced space: it reports that point's objective but returns the
    start's columns. The two objectives then disagree.
    """
    reported = prob.solverModel.getInfo().objective_function_value
    returned = pulp.value(prob.objective)
    return returned is not None and abs(returned - reported) > 1e-7 * max(1.0, abs(reported))


@functools.cache
def _swallow_highs_banner() -> None:
    """HiGHS prints a banner on the process's stdout when its first solver is
    made, whatever ``msg`` says; make that first one with stdout closed."""
    import sys

    import highspy

    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)


def backend_available(backend: str) -> bool:
    """Whether ``backend`` can run here (highspy installed, a CBC binary found)."""
    if backend == "highs":
        available = bool(pulp.HiGHS(msg=False).available())
        if available:
            _swallow_highs_banner()
        return available
    if backend == "cbc":
        return _cbc_path() is not None
    return False


def _cbc_path() -> str | None:
    """CBC on PATH (``pulp[cbc]``), else the binary bundled with PuLP 3.

    COIN_CMD with an explicit path replaces the deprecated PULP_CBC_CMD.
    """
    for path in (shutil.which("cbc"), getattr(pulp.PULP_CBC_CMD, "pulp_cbc_path", None)):
        if path and os.access(path, os.X_OK):
            return str(path)
    return None


def make_solver(
    config: ILPConfig, *, time_limit_s: float | None = None, mip_start: bool = True
) -> pulp.LpSolver:
    """A configured PuLP solver. gapAbs is 0: objective units are internal
    (fractions of the cheapest cost and of the peak bound), so only the
    relative gap means something."""
    options: dict[str, Any] = dict(
        msg=config.msg,
        timeLimit=config.time_limit_s if time_limit_s is None else time_limit_s,
        gapRel=config.mip_gap,
        gapAbs=0.0,
        threads=config.threads,
    )
    if config.backend == "highs":
        _swallow_highs_banner()
        return WarmHiGHS(mip_start=mip_start, **options, **HIGHS_OPTIONS)
    if config.backend == "cbc":
        return pulp.COIN_CMD(path=_cbc_path(), warmStart=mip_start, **options)
    raise ValueError(f"unknown ILP backend {config.backend!r}; choose one of {BACKENDS}")


def run_backend(prob: pulp.LpProblem, config: ILPConfig) -> Outcome:
    """Solve ``prob`` from its initial values; solver errors become an
    Outcome, never an exception."""
    start = time.perf_counter()
    solver = make_solver(config)
    outcome = _solve(prob, solver, config.backend)
    if outcome.status is not None and isinstance(solver, WarmHiGHS) and _start_echoed(prob):
        left = config.time_limit_s - (time.perf_counter() - start)
        log.info("HiGHS returned its MIP start, not its solution; solving again without it")
        if left <= 0:
            return Outcome(None, reason="HiGHS returned its MIP start and no time is left")
        cold = make_solver(config, time_limit_s=left, mip_start=False)
        outcome = _solve(prob, cold, config.backend)
    return outcome


def _solve(prob: pulp.LpProblem, solver: pulp.LpSolver, backend: str) -> Outcome:
    try:
        prob.solve(solver)
    except pulp.PulpSolverError as err:
        return Outcome(None, reason=f"{backend} failed: {err}")
    if prob.status == pulp.LpStatusInfeasible:
        return Outcome(None, infeasible=True, reason=f"{backend} reports the budget infeasible")
    status = {
        pulp.LpSolutionOptimal: Status.OPTIMAL,
        pulp.LpSolutionIntegerFeasible: Status.FEASIBLE,
    }.get(prob.sol_status)
    if status is None:
        stopped = pulp.LpStatus[prob.status]
        return Outcome(None, reason=f"{backend} stopped without a plan ({stopped})")
    bound, gap = _highs_bound(prob) if isinstance(solver, WarmHiGHS) else (None, None)
    return Outcome(status, dual_bound=bound, gap=gap)


def _highs_bound(prob: pulp.LpProblem) -> tuple[float | None, float | None]:
    """HiGHS' MIP dual bound and relative gap, when it solved a MIP."""
    info = prob.solverModel.getInfo()
    if info.mip_node_count < 0:  # an LP: no MIP info
        return None, None
    return float(info.mip_dual_bound), float(info.mip_gap)
