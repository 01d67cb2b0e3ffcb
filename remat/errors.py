"""Errors remat raises on purpose, each saying what to do.

They are defined in the bottom layer (``remat.solvers.errors``), so that the solve
policy and the FX passes raise them without importing this package.
"""

from __future__ import annotations

from remat.solvers.errors import GIB, BudgetError, GraphError, PlanError, SolverUnavailable, format_bytes

__all__ = ["GIB", "BudgetError", "GraphError", "PlanError", "SolverUnavailable", "format_bytes"]
