"""remat: automatic rematerialization for PyTorch training.

Fit one forward+backward under a memory budget at the least added time::

    import remat
    step_model = remat.compile(model, budget_gb=20)
    rep = remat.plan(model, batch, budget_gb=20)
    frontier = remat.sweep(model, batch, points=6)
"""

from remat import solvers  # noqa: F401  (remat.solvers, torch-free)

from .api import compile, plan, reports
from .backend import register as _register
from .budget import budget_bytes
from .errors import BudgetError, GraphError, PlanError, SolverUnavailable
from .frontier import Frontier, sweep
from .options import Options
from . import policies
from .report import NodeRow, Report

_register()

__all__ = ["BudgetError", "Frontier", "GraphError", "NodeRow", "Options", "PlanError", "Report", "SolverUnavailable",
           "budget_bytes", "compile", "plan", "policies", "reports", "sweep"]
__version__ = "0.1.0"
