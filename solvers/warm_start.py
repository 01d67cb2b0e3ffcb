"""The integer program's warm start: a cheap valid plan, and its values for the program's variables.

HiGHS starts from a plan it is given instead of searching for a first one: near the smallest
budget, where no cheap plan fits, that search took most of the time limit. The seed is the best
plan that fits among the cheap ones (store-all, greedy, recompute-all, the peers' rules), the
relaxation's roundings (``rounding.py``) and the caller's seeds; ``warm_start`` writes it into
the variables, with each recomputed value started where the program can express it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .baselines import cheap_plans, store_all
from .blocks import consistent, takes
from .model import candidate_users, exact_starts, step_workspace
from .problem import Problem
from .rounding import rounded_plans
from .simulate import timeline
from .solution import Solution

if TYPE_CHECKING:
    from .ilp import ILPConfig
    from .ilp_model import Model, Objective

log = logging.getLogger(__name__)


def seed_plan(problem: Problem, budget_bytes: int | None, objective: Objective, model: Model,
          config: ILPConfig, seeds: Sequence[Solution] = ()) -> Solution | None:
    """A cheap valid plan: store-all if it fits; else the best that fits of the other
    cheap plans (greedy, recompute-all, the peers' rules) and the relaxation's roundings
    (for "peak", the lowest). Raises InvalidPlan if none is valid."""
    kept_all = store_all(problem)
    if objective == "time" and fits(kept_all, budget_bytes) and takes(kept_all, model.fixed):
        return kept_all
    plans = cheap_plans(problem, 0 if budget_bytes is None else budget_bytes) + list(seeds)
    if not model.fixed:  # a rounding seldom takes the fixed decisions, and the caller's seeds do
        plans += rounded_plans(model, problem, config)
    if model.ties:  # a warm start must be a point of this program
        plans = [p for p in plans if consistent(p.saved, p.recomputed, model.ties)] or [kept_all]
    if model.fixed:
        plans = [p for p in plans if takes(p, model.fixed)]
    if objective == "peak":
        return min(plans, key=lambda p: (p.peak_bytes, p.added_seconds))
    return min((p for p in plans if fits(p, budget_bytes)), key=lambda p: p.added_seconds, default=None)


def fits(plan: Solution, budget_bytes: int | None) -> bool:
    return budget_bytes is None or plan.peak_bytes <= budget_bytes


def warm_start(model: Model, problem: Problem, seed: Solution) -> None:
    """Pass the seed as a MIP start, unless its start options put it over the budget or it
    does not take the program's fixed decisions."""
    if not takes(seed, model.fixed):
        return
    chosen = seed_starts(model, problem, seed)
    line = timeline(problem, seed.saved, seed.recomputed, chosen)
    bound = model.P.upBound
    if bound is not None and max(line, default=0) / model.scales.peak_cap > bound:
        log.debug("ilp: the seed's start options peak over the budget; solving without a start")
        return
    for name, var in model.S.items():
        var.setInitialValue(1 if name in seed.saved else 0)
    for name, var in model.R.items():
        var.setInitialValue(1 if name in seed.recomputed else 0)
        first = chosen.get(name)
        for bound, x in zip(model.starts[name].bounds, model.L[name]):
            x.setInitialValue(1 if first is not None and bound >= first else 0)
    for var, total, w in zip(model.M, line, step_workspace(problem, seed.recomputed, chosen)):
        var.setInitialValue((total - w) / model.scales.bytes)
    model.P.setInitialValue(max(line, default=0) / model.scales.peak_cap)


def seed_starts(model: Model, problem: Problem, seed: Solution) -> dict[str, int]:
    """For each value the seed recomputes, the start the program can express:
    the segment bound (or read) at or before its exact start and the chosen
    start of every recomputed user, so that operands stay ready."""
    exact, users = exact_starts(problem, seed.recomputed), candidate_users(problem)
    chosen: dict[str, int] = {}
    for v in reversed(model.candidates):
        if v.name not in exact or v.name not in model.R:
            continue
        limit = min([exact[v.name], *(chosen[w] for w in users[v.name] if w in chosen)])
        starts = model.starts[v.name]
        k = starts.segment_at(limit)
        if starts.read is not None and limit >= starts.read:
            chosen[v.name] = starts.read
        elif k is not None:
            chosen[v.name] = starts.bounds[k]
    return chosen
