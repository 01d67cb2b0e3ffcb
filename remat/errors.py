"""Errors remat raises on purpose, each saying what to do."""

from __future__ import annotations

# A named solver that cannot run here (its library is missing); it names the installed ones.
from remat.solvers.errors import SolverUnavailable

__all__ = ["GIB", "BudgetError", "GraphError", "PlanError", "SolverUnavailable", "format_bytes"]

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
