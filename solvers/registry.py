"""Solvers by name behind one small protocol.

An explicitly requested solver that cannot run raises SolverUnavailable;
the "ilp" solver's switch from HiGHS to CBC is logged and noted in the
Solution, never silent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .backends import backend_available
from .baselines import checkpoint_blocks, greedy, recompute_all, save_matmuls, store_all
from .errors import SolverUnavailable
from .ilp import ILPConfig, solve_ilp
from .near import many_blocks, solve_near
from .problem import Problem
from .solution import Solution

log = logging.getLogger(__name__)


class Solver(Protocol):
    """Problem and budget in, Solution out."""

    name: str

    def available(self) -> bool: ...

    def solve(self, problem: Problem, budget_bytes: int | None, **kwargs: Any) -> Solution: ...


_REGISTRY: dict[str, Solver] = {}


def register(solver: Solver) -> Solver:
    """Add ``solver`` under its name; a name is registered once."""
    if solver.name in _REGISTRY:
        raise ValueError(f"a solver named {solver.name!r} is already registered")
    _REGISTRY[solver.name] = solver
    return solver


def get(name: str) -> Solver:
    """The solver called ``name``, if it can run here."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown solver {name!r}; registered: {', '.join(names())}")
    solver = _REGISTRY[name]
    if not solver.available():
        why = getattr(solver, "missing", "")
        raise SolverUnavailable(f"solver {name!r} cannot run here{f' ({why})' if why else ''}; "
                                f"installed solvers: {', '.join(available())}")
    return solver


def names() -> tuple[str, ...]:
    """Registered names, in registration order."""
    return tuple(_REGISTRY)


def available() -> tuple[str, ...]:
    """Registered names that can run here."""
    return tuple(name for name, solver in _REGISTRY.items() if solver.available())


@dataclass(frozen=True)
class Baseline:
    """A heuristic plan. store-all and recompute-all plan without looking at
    the budget; a plan over budget carries a note saying so."""

    name: str
    plan: Callable[[Problem, int | None], Solution]

    def available(self) -> bool:
        return True

    def solve(self, problem: Problem, budget_bytes: int | None, **kwargs: Any) -> Solution:
        if kwargs:
            raise TypeError(f"solver {self.name!r} takes no options, got {sorted(kwargs)}")
        solution = self.plan(problem, budget_bytes)
        if budget_bytes is not None and solution.peak_bytes > budget_bytes:
            note = f"over budget: peak {solution.peak_bytes} > {budget_bytes}"
            if note not in solution.notes:
                solution = replace(solution, notes=(*solution.notes, note))
        return solution


@dataclass(frozen=True)
class ILPSolver:
    """The integer program on ``backend``; on ``fallback`` (noted) when
    ``backend`` is missing. Options are ILPConfig fields or ``config=``."""

    name: str
    backend: str
    fallback: str | None = None

    def available(self) -> bool:
        return backend_available(self.backend) or (
            self.fallback is not None and backend_available(self.fallback)
        )

    @property
    def missing(self) -> str:
        """What to install for this solver to run."""
        return {"highs": "HiGHS needs highspy: pip install highspy",
                "cbc": "no CBC binary: PuLP 3 bundles one (pip install --force-reinstall 'pulp>=3.3,<4') "
                       "or put cbc on PATH"}[self.backend]

    def solve(self, problem: Problem, budget_bytes: int | None, **kwargs: Any) -> Solution:
        base = kwargs.pop("config", None) or ILPConfig()
        seeds = kwargs.pop("seeds", ())
        config = replace(base, backend=self.backend, **kwargs)
        notes: tuple[str, ...] = ()
        if not backend_available(self.backend) and self.fallback is not None:
            note = f"{self.backend} unavailable (is highspy installed?): solved with {self.fallback}"
            log.warning("solver %r: %s", self.name, note)
            config, notes = replace(config, backend=self.fallback), (note,)
        if config.near and budget_bytes is not None and many_blocks(problem):
            solution = solve_near(problem, budget_bytes, config=config, seeds=seeds)
        else:
            solution = solve_ilp(problem, budget_bytes, config=config, seeds=seeds)
        return replace(solution, notes=(*notes, *solution.notes))


register(ILPSolver("ilp", backend="highs", fallback="cbc"))
register(ILPSolver("ilp-cbc", backend="cbc"))
register(Baseline("store-all", lambda problem, _budget: store_all(problem)))
register(Baseline("recompute-all", lambda problem, _budget: recompute_all(problem)))
register(Baseline("greedy", greedy))
register(Baseline("save-matmuls", lambda problem, _budget: save_matmuls(problem)))
register(Baseline("checkpoint-blocks", lambda problem, _budget: checkpoint_blocks(problem)))
