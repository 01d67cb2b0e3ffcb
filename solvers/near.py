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
   itself, so the blocks can mix patterns as the budget asks. First as HiGHS's RINS heuristic
   would, but before its root cut loop (``polished``): its relaxation is solved, the decisions
   where it agrees with the shared plan are fixed too, and that smaller program's plan, if
   within the MIP gap of the relaxation's bound, is proven so; otherwise it starts the
   branch and bound over the near program.

Both solves are restrictions of the whole program: the plan is valid and exact under the
simulator, and its bound and gap hold among plans that take the fixed decisions
(``Solution.fixed_decisions`` counts them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from .baselines import store_all
from .blocks import Fixed, agreed_decisions, longest_list
from .ilp import ILPConfig, bound_of, build_model, solve_ilp
from .problem import Problem
from .rounding import LP_SHARE, Relaxation, relax
from .solution import Solution, Status

MIN_COPIES = 8  # identical blocks from which the near solve is used (measured: FORMULATION.md)
SHARED_GAP = 0.03  # the shared plan only says where to look: proving it within 1 % is not needed
INTEGRAL = 1e-6  # a relaxation's fraction this close to 0 or 1 takes that decision


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
    near, proven = polished(problem, budget_bytes, config, fixed, [shared, *fitting])
    if not proven:  # branch and bound over the near program, from the best plan so far
        starts = [near] if near is not None else []
        near = solve_ilp(problem, budget_bytes, config=config, seeds=[*starts, shared, *fitting], fixed=fixed)
    note = (f"{len(fixed)} decisions fixed where the shared plan and the smallest-peak plan agree: the bound "
            f"and gap hold among plans that take them, not among every plan")
    return replace(near, fixed_decisions=len(fixed), notes=(*near.notes, note), solve_seconds=time.perf_counter() - start)


def polished(problem: Problem, budget_bytes: int, config: ILPConfig, fixed: Fixed,
             seeds: Sequence[Solution]) -> tuple[Solution | None, bool]:
    """A plan of the near program, and whether it is proven within ``config.mip_gap`` of the
    relaxation (None where the relaxation was not solved).

    Where the program is large, HiGHS's branch and bound reaches a plan within 1 % only after
    its root cut loop (on 96 layers: 48 s; FORMULATION.md), though the relaxation's bound is
    already that close. So, as its RINS heuristic does: solve the relaxation; fix, besides
    ``fixed``, every decision where it agrees with the first seed (the shared plan); solve that
    smaller program; and if its plan is within the gap of the relaxation's bound, which holds
    for every plan taking ``fixed``, it is proven so."""
    model = build_model(problem, budget_bytes, "time", 0, fixed)
    relaxed = relax(model, replace(config, time_limit_s=config.time_limit_s * LP_SHARE))
    bound = bound_of(model, relaxed.objective)
    if bound is None:
        return None, False
    agreed = {name: decided for name, decided in decisions(seeds[0], relaxed).items() if name not in fixed}
    sub = solve_ilp(problem, budget_bytes, config=config, seeds=seeds, fixed={**fixed, **agreed})
    gap = (sub.added_seconds - bound) / max(abs(sub.added_seconds), 1e-12)
    if sub.status is Status.FALLBACK or sub.added_seconds <= 0 or gap > config.mip_gap:  # no proof
        return sub, False
    note = f"proven within {gap:.2%} of the near program's relaxation ({len(agreed)} more decisions fixed where it agreed)"
    return replace(sub, status=Status.OPTIMAL, bound=bound, gap=max(gap, 0.0), notes=(*sub.notes, note)), True


def decisions(plan: Solution, relaxed: Relaxation) -> Fixed:
    """``plan``'s decisions where the relaxation takes the same, integrally."""
    agreed: Fixed = {}
    for name in relaxed.keep.keys() | relaxed.recompute.keys():
        decided = (name in plan.saved, name in plan.recomputed)
        if all(abs(fraction - taken) <= INTEGRAL
               for fraction, taken in ((relaxed.keep.get(name), decided[0]), (relaxed.recompute.get(name), decided[1]))
               if fraction is not None):
            agreed[name] = decided
    return agreed
