"""remat.solvers: torch-free planning of which forward values to keep.

Problem in, Solution out: the ILP (``solve_ilp``, ``min_peak``), baselines
(``store_all``, ``recompute_all``, ``greedy``) and the simulator that every
one of them reports through (``evaluate``). Solvers are also available by
name through ``get``.

>>> from remat.solvers import get, min_peak, solve_ilp, store_all
>>> from remat.solvers.testing import Node, build_problem
>>> problem = build_problem(
...     inputs=[("x", 10)],
...     forward=[
...         Node("a", 100, ("x",), recompute_seconds=5.0),
...         Node("b", 100, ("a",), recompute_seconds=0.1),
...         Node("out", 10, ("b",), output=True),
...     ],
...     backward=[Node("g1", 200), Node("g2", 10, ("b",)), Node("g3", 10, ("a",), grad=True)],
... )
>>> store_all(problem).peak_bytes
420
>>> plan = solve_ilp(problem, 350)
>>> sorted(plan.saved), sorted(plan.recomputed), plan.peak_bytes, plan.status.value
(['a'], ['b'], 320, 'optimal')
>>> min_peak(problem).peak_bytes
230
>>> get("greedy").solve(problem, 350).recomputed == plan.recomputed
True
"""

from .baselines import checkpoint_blocks, greedy, recompute_all, save_matmuls, store_all
from .errors import Infeasible, InvalidPlan, NoPlanFound, SolverUnavailable
from .ilp import ILPConfig, min_peak, solve_ilp
from .problem import Kind, Problem, Value
from .registry import Solver, available, get, names, register
from .simulate import added_seconds, canonical, check_plan, closure, evaluate, timeline
from .solution import Solution, Status

__all__ = [
    "ILPConfig",
    "Infeasible",
    "InvalidPlan",
    "Kind",
    "NoPlanFound",
    "Problem",
    "Solution",
    "Solver",
    "SolverUnavailable",
    "Status",
    "Value",
    "added_seconds",
    "available",
    "canonical",
    "check_plan",
    "checkpoint_blocks",
    "closure",
    "evaluate",
    "get",
    "greedy",
    "min_peak",
    "names",
    "recompute_all",
    "register",
    "save_matmuls",
    "solve_ilp",
    "store_all",
    "timeline",
]
