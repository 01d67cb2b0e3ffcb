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
