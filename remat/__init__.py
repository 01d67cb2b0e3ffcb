"""remat: automatic rematerialization for PyTorch training.

Fit one forward+backward under a memory budget at the least added time::

    import remat
    step_model = remat.compile(model, budget_gb=20)
    rep = remat.plan(model, batch, budget_gb=20)
    frontier = remat.sweep(model, batch, points=6)

``import remat`` imports no torch: each name below is imported when first read
(PEP 562), so ``remat --help`` and ``import remat.solvers`` stay quick and
torch-free. Reading a name that needs torch also registers ``backend="remat"``
with dynamo (installed, the ``torch_dynamo_backends`` entry point does that too).
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:  # what the names resolve to, for type checkers and editors
    from . import policies, solvers
    from .api import compile, plan, reports
    from .budget import budget_bytes
    from .capacity import fit
    from .errors import BudgetError, GraphError, PlanError, SolverUnavailable
    from .frontier import Frontier, sweep
    from .options import Options
    from .report import NodeRow, Report

__all__ = ["BudgetError", "Frontier", "GraphError", "NodeRow", "Options", "PlanError", "Report", "SolverUnavailable",
           "budget_bytes", "compile", "fit", "plan", "policies", "reports", "sweep"]
__version__ = "0.1.0"

# Each public name -> the module that defines it ("" for the submodule of that name).
_HOMES = {"compile": ".api", "plan": ".api", "reports": ".api", "budget_bytes": ".budget", "fit": ".capacity",
          "BudgetError": ".errors", "GraphError": ".errors", "PlanError": ".errors", "SolverUnavailable": ".errors",
          "Frontier": ".frontier", "sweep": ".frontier", "Options": ".options", "NodeRow": ".report",
          "Report": ".report", "policies": "", "solvers": ""}
_NEED_TORCH = {"compile", "fit", "plan", "reports", "Frontier", "sweep", "policies"}  # they import torch


def __getattr__(name: str) -> _typing.Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'remat' has no attribute {name!r}")
    home = _HOMES[name]
    module = _importlib.import_module(home or f".{name}", __name__)
    value = module if not home else getattr(module, name)
    if name in _NEED_TORCH:
        _register_backend()
    globals()[name] = value  # read once: later reads skip this function
    return value


def __dir__() -> list[str]:
    """The public names, read or not yet, and what was imported here (submodules, dunders)."""
    return sorted(name for name in set(globals()) | set(_HOMES) if not name.startswith("_") or name.startswith("__"))


def _register_backend() -> None:
    """``backend="remat"`` known to dynamo in this process, as the entry point makes it once installed."""
    from .backend import register

    register()
