"""Errors the solvers raise; each says what went wrong in terms of the Problem."""

from __future__ import annotations


class InvalidPlan(ValueError):
    """A keep/recompute plan breaks a rule of the model (see FORMULATION.md)."""


class Infeasible(ValueError):
    """No plan fits the budget: it is below the smallest reachable peak.

    ``min_peak`` computes that smallest peak exactly.
    """


class SolverUnavailable(RuntimeError):
    """A solver was requested by name but cannot run here (a missing library)."""


class NoPlanFound(RuntimeError):
    """The solver stopped (time limit, numerical failure) without a plan within
    the budget, and no cheap plan fits either. Not a proof of infeasibility:
    a longer time limit may find one."""


# --- errors remat raises to its users (re-exported by ``remat.errors``) -------
# They live here, in the bottom layer, so that the solve policy (``plan.py``) and
# the FX passes raise them without importing the user-facing package.

GIB = 2**30


def format_bytes(nbytes: float | None) -> str:
    """Bytes for people: GiB when large, MiB or KiB otherwise (binary units).

    >>> format_bytes(3 * 2**30), format_bytes(1536 * 2**10)
    ('3.000 GiB', '1.500 MiB')
    """
    if nbytes is None:
        return "none"
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.3f} {unit}"
    return f"{int(nbytes)} B"


class BudgetError(ValueError):
    """The budget is below the smallest peak any plan reaches for this graph."""

    def __init__(self, message: str, *, budget_bytes: int, min_feasible_bytes: int) -> None:
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes


class PlanError(RuntimeError):
    """The realized graphs disagree with the plan in a way that could be wrong."""


class GraphError(ValueError):
    """remat cannot capture or plan this graph as written; the message says what to change."""
