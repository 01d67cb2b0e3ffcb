"""The plan at a budget for graphs of many identical blocks: solved near the shared plan.

On deep graphs the whole program's branch and bound is the limit (FORMULATION.md, "Near the
shared plan"): on a 96-layer GPT-style graph it stopped at its time limit with a plan 15x
slower than the shared program's. Near a budget the best plans differ from block to block in
a few positions only (keep a block's output or its input, recompute a norm or keep it), so:

1. the shared program (period 1, ``blocks.shared_decisions``) gives a plan at the budget in
   which every interior block decides alike;
2. where that plan and the other plans given (the smallest-peak plan) take the same decision
   at a position of every identical block, the decision is fixed (``blocks.agreed_decisions``);
3. the program is solved with those fixed: at the other positions each block decides for
   itself, so the blocks can mix patterns as the budget asks.

Both solves are restrictions of the whole program: the plan is valid and exact under the
simulator, and its bound and gap hold among plans that take the fixed decisions
(``Solution.fixed_decisions`` counts them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from .baselines import store_all
from .blocks import agreed_decisions, longest_list
from .ilp import ILPConfig, solve_ilp
from .problem import Problem
from .solution import Solution

MIN_COPIES = 8  # identical blocks from which the near solve is used (measured: FORMULATION.md)
SHARED_GAP = 0.03  # the shared plan only says where to look: proving it within 1 % is not needed


def many_blocks(problem: Problem) -> bool:
    """Whether ``problem`` has at least ``MIN_COPIES`` blocks in one list (``Value.block``)."""
    return longest_list(problem) >= MIN_COPIES


def solve_near(problem: Problem, budget_bytes: int, *, config: ILPConfig, seeds: Sequence[Solution] = ()) -> Solution:
    """The least added time within ``budget_bytes`` among plans that take the decisions the shared
    plan and ``seeds`` agree on (see the module's docstring); never slower than the shared plan."""
    if store_all(problem).peak_bytes <= budget_bytes:  # a budget that does not bind: nothing to mix
        return solve_ilp(problem, budget_bytes, config=config, seeds=seeds)
    start = time.perf_counter()
    shared = solve_ilp(problem, budget_bytes, config=replace(config, share_blocks=1, mip_gap=SHARED_GAP), seeds=seeds)
    fitting = [s for s in seeds if s.peak_bytes <= budget_bytes]
    fixed = agreed_decisions(problem, [shared, *seeds])
    near = solve_ilp(problem, budget_bytes, config=config, seeds=[shared, *fitting], fixed=fixed)
    note = (f"{len(fixed)} decisions fixed where the shared plan and the smallest-peak plan agree: the bound "
            f"and gap hold among plans that take them, not among every plan")
    return replace(near, fixed_decisions=len(fixed), notes=(*near.notes, note), solve_seconds=time.perf_counter() - start)
