"""The integer program of FORMULATION.md, modelled with PuLP.

Reads like the formulation: ``add_variables`` here, ``add_constraints`` and
``add_objective`` in ``ilp_rows.py``, on the ``Model`` of ``ilp_model.py``; PuLP names
carry indices (``S_3``, ``need_3``, ``memory_17``) and ``Model.candidates[i]`` maps them
back to value names.
``solve_ilp`` wraps the model with a warm start (``warm_start.py``) and a fallback so that it
always returns a valid plan within the budget, or raises.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pulp

from .backends import Outcome, run_backend
from .blocks import Fixed, Ties, shared_decisions, tied_blocks
from .errors import Infeasible, InvalidPlan, NoPlanFound
from .ilp_model import Model, Objective, Scales
from .ilp_rows import TIE_BREAK, add_constraints, add_objective
from .model import Starts, fixed_diff, recomputable, running_sum, start_segments, workspace
from .problem import Problem
from .simulate import canonical, evaluate, timeline
from .solution import Solution, Status
from .warm_start import fits, seed_plan, warm_start

log = logging.getLogger(__name__)

_COST_SPAN = 1e-4  # costs below this fraction of the largest one count as that fraction
_MEM_STEPS = 1e6  # the peak upper bound spans this many memory units


@dataclass(frozen=True)
class ILPConfig:
    """How to solve: backend "highs" (highspy) or "cbc" (bundled with PuLP).

    ``time_limit_s`` bounds the solver run; ``mip_gap`` is relative, and
    OPTIMAL means proven within it. ``share_blocks``: 0, every value decides
    for itself; ``k`` >= 1, the interior copies of identical repeated blocks
    ``k`` places apart take one set of decisions (``blocks.py``), a smaller
    program whose plans are a subset of the whole program's. ``near``: a plan at a
    budget on a graph of many identical blocks is solved near the shared plan (``near.py``,
    through the solver registry).
    """

    backend: str = "highs"
    time_limit_s: float = 30.0
    mip_gap: float = 1e-2
    threads: int | None = None
    msg: bool = False
    share_blocks: int = 0
    near: bool = False  # at a budget, on graphs of many identical blocks: solve near the shared plan (near.py)


def scales_for(problem: Problem, starts: dict[str, Starts]) -> Scales:
    """tau = TIE_BREAK times the cheapest nonzero cost (floored so that costs
    span at most 4 decades); a memory unit so that the peak bound is about a
    million units."""
    costs = [c for v in problem.candidates() for c in (v.recompute_seconds, v.save_seconds) if c > 0]
    cheapest = max(min(costs), max(costs) * _COST_SPAN) if costs else 1.0
    tau = TIE_BREAK * cheapest
    names = [v.name for v in problem.candidates()]
    earliest = {name: s.earliest for name, s in starts.items() if s.earliest is not None}
    cap = max(timeline(problem, names, names, earliest), default=0)
    return Scales(seconds=tau, bytes=max(1.0, cap / _MEM_STEPS), peak_cap=max(cap, 1))


class Program(pulp.LpProblem):  # type: ignore[misc]
    """An LpProblem that lists its columns once it is built (``freeze``). PuLP's ``variables()``
    walks every row each time it is asked, about ten times per solve (0.1 s of a 12-layer plan),
    while every column here is registered when it is made and none is added after building."""

    columns: list[pulp.LpVariable] | None = None

    def variables(self) -> list[pulp.LpVariable]:
        return self.columns if self.columns is not None else super().variables()

    def freeze(self) -> None:
        self.columns = super().variables()


def add_variables(problem: Problem, budget_bytes: int | None, scales: Scales,
                  starts: dict[str, Starts], ties: Ties | None = None, fixed: Fixed | None = None) -> Model:
    """S_v / R_v binaries for candidates (omitted where forced to 0), the
    continuous L_v,k in [0, 1] (v recomputed and alive in its k-th segment
    before its read), M_t, P. A tied value shares its representative's; a ``fixed``
    value's binaries are fixed (both bounds) to the decision taken."""
    prob = Program("remat", pulp.LpMinimize)
    candidates, ties = problem.candidates(), ties or {}
    may_recompute = recomputable(problem)
    own = [(i, v) for i, v in enumerate(candidates) if v.name not in ties]
    fixed = fixed or {}
    S = {v.name: _binary(prob, f"S_{i}", fixed.get(v.name, (None,))[0]) for i, v in own if v.savable}
    R = {v.name: _binary(prob, f"R_{i}", fixed.get(v.name, (None, None))[1])
         for i, v in own if v.name in may_recompute}
    L = {v.name: [prob.add_variable(f"L_{i}_{k}", lowBound=0, upBound=1)
                  for k in range(len(starts[v.name].bounds))]
         for i, v in enumerate(candidates) if v.name in may_recompute and not _shares_starts(v.name, ties, starts)}
    for copy, rep in ties.items():
        for decisions in (S, R, L):
            if rep in decisions and copy not in decisions:
                decisions[copy] = decisions[rep]
    M = [prob.add_variable(f"M_{t}", lowBound=0) for t in range(problem.num_steps)]
    # P is the peak as a fraction of peak_cap: its cost in the objective stays
    # far above solver tolerances, which drop costs near 1e-7 (a tie-break on
    # P in memory units vanished at realistic sizes). The budget is P's bound;
    # memory totals are whole bytes, so B + 1/2 admits exactly the same plans
    # while giving solvers half a byte of room (CBC's preprocessing declared
    # budgets met with equality infeasible).
    cap = None if budget_bytes is None else (budget_bytes + 0.5) / scales.peak_cap
    P = prob.add_variable("P", lowBound=0, upBound=cap)
    return Model(prob, candidates, S, R, L, starts, M, P, scales, ties=dict(ties), fixed=dict(fixed))


def _shares_starts(name: str, ties: Ties, starts: dict[str, Starts]) -> bool:
    """A tied copy shares its representative's segment variables when it has as many segments
    (segment k of each is alive from the k-th possible start of its own recompute); otherwise
    it keeps its own. Sharing them is a further restriction, and halves the solve time of a
    48-layer GPT-style graph's smallest-peak search (FORMULATION.md)."""
    rep = ties.get(name)
    return rep is not None and len(starts[name].bounds) == len(starts[rep].bounds)


def _binary(prob: pulp.LpProblem, name: str, taken: bool | None = None) -> pulp.LpVariable:
    """A 0/1 decision; ``taken`` fixes it (True: 1, False: 0)."""
    var = prob.add_variable(name, lowBound=0, upBound=1, cat=pulp.LpBinary)
    if taken is not None:  # after creating it: PuLP gives every binary the bounds 0 and 1
        var.lowBound = var.upBound = int(taken)
    return var


def build_model(problem: Problem, budget_bytes: int | None, objective: Objective = "time",
                share_blocks: int = 0, fixed: Fixed | None = None) -> Model:
    """The whole program for ``problem``; ``budget_bytes`` None is no budget. ``share_blocks``:
    the period at which interior copies of identical blocks share their decisions
    (``blocks.shared_decisions``); 0 shares none. ``fixed``: decisions taken before the
    solve (``blocks.agreed_decisions``)."""
    starts = start_segments(problem)  # one pass over the graph serves the scales and the variables
    ties = shared_decisions(problem, recomputable(problem), share_blocks) if share_blocks else {}
    model = add_variables(problem, budget_bytes, scales_for(problem, starts), starts, ties, fixed)
    add_constraints(model, problem)
    add_objective(model, objective)
    model.prob.freeze()
    return model


def solve_ilp(
    problem: Problem,
    budget_bytes: int | None,
    *,
    config: ILPConfig | None = None,
    objective: Objective = "time",
    seeds: Sequence[Solution] = (),
    fixed: Fixed | None = None,
) -> Solution:
    """The least added time within ``budget_bytes`` (objective "time"), or the
    smallest peak (objective "peak", no budget).

    Always a valid plan within the budget: the solver's, or, when it fails,
    the cheap seed with status FALLBACK. Raises Infeasible when the budget is
    provably below every plan's peak, InvalidPlan when nothing can be
    planned, NoPlanFound when the solver failed and no seed fits.
    ``config.time_limit_s`` bounds the solver run, not model building. ``seeds``: other
    valid plans to start from (the smallest-peak plan, near the smallest budget, where no
    cheap plan fits and the solver would otherwise search for a first plan).
    """
    config = config or ILPConfig()
    if objective == "peak" and budget_bytes is not None:
        raise ValueError("objective='peak' takes no budget")
    start = time.perf_counter()
    _check_fixed_fits(problem, budget_bytes)
    if not problem.candidates():  # nothing to decide: the check above settled it
        return evaluate(problem, (), solver=_name(config), status=Status.OPTIMAL)
    model = build_model(problem, budget_bytes, objective, config.share_blocks, fixed)
    seed = seed_plan(problem, budget_bytes, objective, model, config, seeds)
    if seed is not None:
        warm_start(model, problem, seed)
    log.debug("ilp: %d columns, %d rows", len(model.prob.variables()), len(model.prob.constraints()))
    left = max(config.time_limit_s - (time.perf_counter() - start), 1.0)
    outcome = run_backend(model.prob, replace(config, time_limit_s=left))
    plan = _read_plan(model, problem, budget_bytes, config, outcome, seed)
    if model.ties:
        plan = _shared(plan, problem, model.ties)
    return replace(plan, solve_seconds=time.perf_counter() - start)


def _shared(plan: Solution, problem: Problem, ties: Ties) -> Solution:
    """The plan marked as the optimum among plans that share the tied blocks' decisions."""
    blocks = tied_blocks(problem, ties)
    note = (f"{blocks} identical blocks shared one set of decisions: the bound and gap hold among "
            f"such plans, not among every plan")
    return replace(plan, shared_blocks=blocks, notes=(*plan.notes, note))


def min_peak(problem: Problem, *, config: ILPConfig | None = None) -> Solution:
    """The plan with the smallest peak; its ``peak_bytes`` is the smallest
    budget any plan fits (within the MIP gap of ``config``)."""
    return solve_ilp(problem, None, config=config, objective="peak")


def _name(config: ILPConfig) -> str:
    return f"ilp-{config.backend}"


def _check_fixed_fits(problem: Problem, budget_bytes: int | None) -> None:
    """Raise Infeasible, naming the step, when fixed memory alone is over budget."""
    if budget_bytes is None or not problem.num_steps:
        return
    fixed = [m + w for m, w in zip(running_sum(fixed_diff(problem)), workspace(problem))]
    t = max(range(len(fixed)), key=fixed.__getitem__)
    if fixed[t] > budget_bytes:
        where = problem.step_names[t] if problem.step_names else f"step {t}"
        raise Infeasible(
            f"budget {budget_bytes} bytes is below the {fixed[t]} bytes that every plan "
            f"holds at {where} (inputs, unavoidable values and workspace)"
        )


def _read_plan(
    model: Model,
    problem: Problem,
    budget_bytes: int | None,
    config: ILPConfig,
    outcome: Outcome,
    seed: Solution | None,
) -> Solution:
    """The solver's plan, extracted canonically and checked by simulate, or the seed."""
    name = _name(config)
    if outcome.infeasible and seed is None:
        raise Infeasible(
            f"no plan fits {budget_bytes} bytes; min_peak() gives the smallest feasible budget"
        )
    if outcome.status is None:
        return _fallback(seed, name, outcome.reason)
    chosen = {n for n, var in model.S.items() if (var.varValue or 0.0) > 0.5}
    try:
        plan = evaluate(problem, canonical(problem, chosen), solver=name, status=outcome.status)
    except InvalidPlan as err:
        return _fallback(seed, name, f"extracted plan is invalid ({err})")
    if not fits(plan, budget_bytes):
        reason = f"extracted plan peaks at {plan.peak_bytes} > budget {budget_bytes}"
        return _fallback(seed, name, reason)
    plan = replace(plan, bound=bound_of(model, outcome.dual_bound), gap=outcome.gap)
    if seed is not None and _better(seed, plan, model):  # within the MIP gap, or time-limited
        note = f"the {seed.solver} warm start beat the solver's incumbent"
        return replace(seed, solver=name, status=outcome.status, bound=plan.bound, gap=plan.gap, notes=(note,))
    return plan


def _better(seed: Solution, plan: Solution, model: Model) -> bool:
    if model.objective == "peak":
        return seed.peak_bytes < plan.peak_bytes
    return seed.added_seconds < plan.added_seconds


def bound_of(model: Model, dual_bound: float | None) -> float | None:
    """A dual bound of ``model``'s objective (the solver's, or its relaxation's optimum) in
    seconds (time) or bytes (peak).

    The tie-break adds at most TIE_BREAK (peak) or 1 (time) objective unit,
    so it is subtracted to keep the bound valid for the main term alone.
    """
    if dual_bound is None or not math.isfinite(dual_bound):
        return None
    if model.objective == "peak":
        return max(0.0, (dual_bound - TIE_BREAK) * model.scales.bytes)
    return max(0.0, (dual_bound - 1.0) * model.scales.seconds)


def _fallback(seed: Solution | None, name: str, reason: str) -> Solution:
    """The seed, loudly; without one there is no plan to return."""
    if seed is None:
        raise NoPlanFound(f"{name}: {reason}; no cheap plan fits the budget either")
    log.warning("%s: %s; returning the %s plan", name, reason, seed.solver)
    note = f"{reason}; returned the {seed.solver} plan"
    return replace(seed, solver=name, status=Status.FALLBACK, notes=(*seed.notes, note))
