"""The solve policy: which plan a graph gets under a budget. No torch here.

The FX passes turn a graph into a :class:`Problem` and hand it here with a plain
:class:`Request`; everything about *which* plan follows from those two, and is
tested on ``random_problem``s in milliseconds:

- no budget, or one at or above store-all's peak: the fastest plan (never binding);
- a budget below the smallest peak: :class:`BudgetError` naming the smallest
  feasible budget and what dominates memory there (or, for a caller that judges
  plans by another account, the smallest-peak plan: ``settle_for_lowest``);
- otherwise the chosen solver's plan; if it fails or does not fit, the fastest
  plan that fits among the cheap ones and the smallest-peak plan;
- ``extra`` candidate plans (torch's min-cut saved set, say) are taken where they
  fit and are faster, so remat's plan is never slower than them under the model.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from .baselines import cheap_plans, checkpoint_blocks, save_matmuls, store_all
from .errors import GIB, BudgetError, Infeasible, InvalidPlan, PlanError, format_bytes
from .ilp import ILPConfig, min_peak
from .lazy import Once
from .near import many_blocks
from .model import copies_kept_bytes, exact_starts, handoff_step, step_workspace
from .problem import Kind, Problem, Value, storage_of
from .registry import available, get
from .simulate import added_seconds, alive_at, closure, evaluate
from .solution import Solution, Status

log = logging.getLogger("remat.solvers.plan")
# The smallest-peak search stops once its plan is proven within this fraction of the model's
# minimum. The incumbent is usually found in a second or two; proving 1 % took 5x longer than
# proving 3 % on 2-layer transformers (the relaxation's bound is weak), and the figure it gives,
# the smallest feasible budget, only says where BudgetError starts (below the plan it found).
SMALLEST_PEAK_GAP = 0.03
# The smallest-peak search gives interior copies of identical blocks one set of decisions
# (period 1: every interior copy the same). On GPT-style graphs (d=256, seq 128) it found the
# same smallest peak as the whole program at 12 layers (88.4 MiB) in 1.2-1.6 s instead of 4.5-5.4 s,
# and at 48 layers proved 312.4 MiB in 4.3 s where the whole program stopped at its 30 s limit
# with a 51 % gap (FORMULATION.md, "Shared blocks").
SMALLEST_PEAK_SHARING = 1
# A binding budget no cheap plan fits is first given to the ILP for this long: a plan it finds
# proves the budget feasible without the smallest-peak search (30 s, its time limit, on a
# 4-layer d=128 GPT, where the ILP at half way to store-all was optimal in 0.65 s).
FIRST_TRY_S = 10.0
# A plan at a budget on a graph of at least near.MIN_COPIES identical blocks is solved near the
# shared plan (near.py): on GPT-style graphs (d=256, seq 128) at half way to store-all, 12 layers
# took 2.3 s with the smallest-peak solve against 14-16 s for the whole program (the same plan),
# and 96 layers gave a plan 15x faster than the whole program's at its time limit
# (FORMULATION.md, "Near the shared plan").
NEAR = True


@dataclass(frozen=True)
class Request:
    """What the caller asks of a solve: plain data, no torch.

    - ``budget_bytes``: the peak the step may reach; ``None``: no limit.
    - ``headroom``: a fraction of the budget to hold back (``None``: nothing).
    - ``solver``: a name from :func:`remat.solvers.names`.
    - ``time_limit_s``: per solve; the best plan found by then is used.
    """

    budget_bytes: int | None = None
    headroom: float | None = None
    solver: str = "ilp"
    time_limit_s: float = 30.0

    @property
    def target(self) -> int | None:
        """The peak the plan itself must fit: the budget less the headroom fraction."""
        if self.budget_bytes is None:
            return None
        return int(self.budget_bytes * (1 - self.headroom)) if self.headroom else self.budget_bytes

    @property
    def config(self) -> ILPConfig:
        return ILPConfig(time_limit_s=self.time_limit_s, near=NEAR)

    @property
    def smallest_peak_config(self) -> ILPConfig:
        return ILPConfig(time_limit_s=self.time_limit_s, mip_gap=SMALLEST_PEAK_GAP, share_blocks=SMALLEST_PEAK_SHARING)


Lowest = Once[Solution]  # the smallest-peak plan, solved on the first call


def lowest_of(problem: Problem, request: Request) -> Lowest:
    """The smallest-peak plan of ``problem``, solved when first called."""
    return Once(lambda: smallest_peak(problem, request.smallest_peak_config))


Extra = Sequence[Solution] | Callable[[], Sequence[Solution]]


def solve(problem: Problem, request: Request, lowest: Lowest | None = None, *, target: int | None = None,
          settle_for_lowest: bool = False, extra: Extra = ()) -> tuple[Solution, Solution]:
    """(plan, store-all); raises :class:`BudgetError` below the smallest peak.

    ``lowest``: the smallest-peak plan, called only where it is needed: a binding budget
    (is it feasible?) or a failed solve (a fall-back). With no budget, or one at or above
    store-all's peak, it is never solved. ``target``: the peak the plan must fit (default:
    ``request.target``). ``settle_for_lowest``: below the smallest peak, return the
    smallest-peak plan instead of raising (the caller judges it by its own account).
    ``extra``: other valid plans (or a function making them, called only when the budget
    binds: unbound, the solver's plan is the fastest), taken where they fit and are faster.
    """
    budget = request.target if target is None else target
    kept_all = store_all(problem)
    lowest = lowest or lowest_of(problem, request)
    # store-all's peak is at least the smallest: only a budget below it can be infeasible, and
    # one a cheap plan fits, or the solver finds a plan for quickly, is not (so the smallest-peak
    # search, the slowest solve, is not needed to know it)
    binding = budget is not None and budget < kept_all.peak_bytes
    quick = None
    if binding and not any(p.peak_bytes <= budget for p in cheap_plans(problem, budget)):
        quick = first_try(problem, budget, request)
        if quick is None and budget < lowest().peak_bytes:
            if settle_for_lowest:
                note = "below the model's smallest peak: the smallest-peak plan, judged by its compiled program"
                return replace(lowest(), notes=(*lowest().notes, note)), kept_all
            raise infeasible(problem, request.budget_bytes, lowest(), request.headroom)
    # No plan holds more than keeping everything: a budget at or above that
    # peak (or none) is never binding, and every such budget gets one plan.
    cap = kept_all.peak_bytes if budget is None else min(budget, kept_all.peak_bytes)
    if quick is not None and quick.status is Status.OPTIMAL:
        plan = quick
    else:  # the full solve, started from the quick plan where there is one
        plan = solve_or_fall_back(problem, cap, request, lowest, seeds=[quick] if quick is not None else [])
    if plan.status is Status.FEASIBLE:
        gap = "unknown" if plan.gap is None else f"{plan.gap:.2%}"
        note = (f"time limit of {request.time_limit_s:g} s reached: the best plan found "
                f"(gap to optimal {gap}); raise time_limit_s for a faster one")
        plan = replace(plan, notes=(*plan.notes, note))
    if budget is None or budget >= kept_all.peak_bytes:
        return plan, kept_all
    return fastest_of(plan, extra() if callable(extra) else extra, cap), kept_all


def monotone(plans: Sequence[Solution | None], caps: Sequence[int]) -> list[Solution | None]:
    """For each cap, the fastest of all ``plans`` that fits it (ties: the smaller peak): a sweep's
    plans made so that a lower budget never gets a faster plan or a higher peak, even where a
    time-limited solve found a worse plan at one budget than another budget's plan that fits it.
    A cap whose own solve found no plan (None) keeps None.

    >>> def plan(peak, seconds): return Solution("ilp", frozenset(), frozenset(), peak, (), seconds, Status.OPTIMAL,
    ...                                          None, None, 0.0)
    >>> [p.added_seconds for p in monotone([plan(10, 2.0), plan(8, 1.0)], [10, 12])]
    [1.0, 1.0]
    """
    found = [p for p in plans if p is not None]
    chosen: list[Solution | None] = []
    for own, cap in zip(plans, caps, strict=True):
        if own is not None:
            best = min((p for p in found if p.peak_bytes <= cap), key=lambda p: (p.added_seconds, p.peak_bytes))
            if (best.added_seconds, best.peak_bytes) < (own.added_seconds, own.peak_bytes):
                own = replace(best, notes=(*best.notes, "the plan found for another budget: faster within this one"))
        chosen.append(own)
    return chosen


def first_try(problem: Problem, budget: int, request: Request) -> Solution | None:
    """The ILP's plan within ``budget`` after at most ``FIRST_TRY_S``, or None when it has none
    by then (or the solver is not an ILP). A plan found proves the budget feasible; an optimal
    one is the plan."""
    if not request.solver.startswith("ilp") or near(problem, request):
        return None  # the near solve starts from the smallest-peak plan: the full path has it
    quick = replace(request, time_limit_s=min(request.time_limit_s, FIRST_TRY_S))
    try:
        plan = get(request.solver).solve(problem, budget, config=quick.config, seeds=[])
    except Exception as exc:  # infeasible, out of time with no plan, or a fault: the full path decides
        log.debug("remat: no quick plan within %s: %s", format_bytes(budget), exc)
        return None
    return plan if plan.peak_bytes <= budget else None


def near(problem: Problem, request: Request) -> bool:
    """Whether the plan at a budget is solved near the shared plan (``near.py``)."""
    return request.solver.startswith("ilp") and request.config.near and many_blocks(problem)


def fastest_of(plan: Solution, extra: Sequence[Solution], cap: int) -> Solution:
    """``plan``, or an ``extra`` plan that fits ``cap`` and is faster under the model."""
    better = [p for p in extra if p.peak_bytes <= cap and p.added_seconds < plan.added_seconds]
    if not better:
        return plan
    best = min(better, key=lambda p: p.added_seconds)
    note = f"the {best.solver} plan is faster under the model than the {plan.solver} plan found, and fits"
    return replace(best, notes=(*best.notes, note))


def smallest_peak(problem: Problem, config: ILPConfig) -> Solution:
    """The min-peak ILP's plan, or store-all where that peaks lower (any valid plan
    bounds the smallest peak; the ILP's may be time-limited); if the ILP fails,
    the lowest cheap plan (an upper bound), noted."""
    try:
        return min(min_peak(problem, config=config), store_all(problem), key=lambda s: s.peak_bytes)
    except Exception as exc:  # a solver fault must not lose the plan: see solve_or_fall_back
        reason = f"the smallest-peak solve failed ({type(exc).__name__}: {exc})"
        log.warning("remat: %s; the smallest feasible budget is a cheap plan's, an upper bound", reason)
        plan = min(cheap_plans(problem, 0), key=lambda s: s.peak_bytes)
        return replace(plan, status=Status.FALLBACK, notes=(*plan.notes, f"{reason}; bound from {plan.solver}"))


def solve_or_fall_back(problem: Problem, cap: int, request: Request, lowest: Lowest,
                       seeds: Sequence[Solution] = ()) -> Solution:
    """The chosen solver's plan within ``cap``; if the solver raises or its
    plan does not fit, the fastest plan that fits among the cheap ones and
    the smallest-peak plan ``lowest()``, with status FALLBACK and the reason noted.

    Near the smallest peak the solver may stop at its time limit with no
    plan, or (where a value's earliest starts merge into one segment) count
    a plan above the exact memory, while ``lowest`` fits.
    """
    name = request.solver
    # near the smallest peak the smallest-peak plan, when already solved, is the first plan that fits;
    # the near solve fixes what it and the shared plan agree on, so it is solved for that
    starts = [*seeds, *([lowest()] if lowest.done or near(problem, request) else [])]
    kwargs = {"config": request.config, "seeds": starts} if name.startswith("ilp") else {}
    cause: Exception | None = None
    try:
        plan = get(name).solve(problem, cap, **kwargs)
        if plan.peak_bytes <= cap:
            return plan
        reason = (f"solver {name!r} found no plan within {format_bytes(cap)} (its plan peaks at "
                  f"{format_bytes(plan.peak_bytes)})")
    except Infeasible as exc:  # near the smallest peak: see the docstring
        reason, cause = f"solver {name!r} found no plan within {format_bytes(cap)}", exc
    except Exception as exc:  # any fault inside a solver library: never lose the step over it
        reason, cause = f"solver {name!r} failed ({type(exc).__name__}: {exc})", exc
    fits = [p for p in [*cheap_plans(problem, cap), lowest()] if p.peak_bytes <= cap]
    if not fits:
        raise PlanError(f"{reason}, and no cheap plan fits {format_bytes(cap)}: raise the budget, "
                        f"or try another solver ({', '.join(available())})") from cause
    plan = min(fits, key=lambda s: s.added_seconds)
    log.warning("remat: %s; using the %s plan", reason, plan.solver)
    return replace(plan, status=Status.FALLBACK, notes=(*plan.notes, f"{reason}; used the {plan.solver} plan"))


# --- another partitioner's plan in remat's model -------------------------------


def kept_in_model(problem: Problem, saved: Collection[str]) -> frozenset[str]:
    """Another partitioner's saved set in the model's terms.

    It may save a view; keeping a view keeps its base's storage, which is what the
    model's plan says when it keeps the base. Names the model does not plan are dropped.
    """
    values = problem.by_name()
    kept = set()
    for name in (storage_of(values, n) for n in saved):
        if name in values and values[name].is_candidate and values[name].savable:
            kept.add(name)
    return frozenset(kept)


def peer_plan(problem: Problem, saved: Collection[str], solver: str) -> Solution | None:
    """Another partitioner's plan (its saved node names) as a Solution of the model, or
    None where its peak is not expressible there (it recomputes a chain the model only
    allows with an operand kept)."""
    try:
        return evaluate(problem, kept_in_model(problem, saved), solver=solver)
    except InvalidPlan as exc:
        log.debug("%s plan not expressible in the model: %s", solver, exc)
        return None


def score_peer(problem: Problem, saved: Collection[str], solver: str) -> tuple[int | None, float]:
    """(peak, added seconds over store-all) of another partitioner's plan under remat's
    model; the peak is None where the plan is not expressible (the time always has a value)."""
    kept = kept_in_model(problem, saved)
    seconds = added_seconds(problem, kept, closure(problem, kept)) - store_all(problem).added_seconds
    plan = peer_plan(problem, saved, solver)
    return (None if plan is None else plan.peak_bytes), seconds


def peer_rules(problem: Problem) -> dict[str, dict[str, float]]:
    """The peers' own rules as plans of the model, by name: checkpoint per block (where the graph
    has blocks) and save matmuls, each with its peak and added seconds over store-all. A rule the
    graph cannot follow (a view that can be neither kept nor recomputed) is left out."""
    base = store_all(problem).added_seconds
    rules = [save_matmuls] if not any(v.block for v in problem.values) else [checkpoint_blocks, save_matmuls]
    out = {}
    for rule in rules:
        try:
            plan = rule(problem)
        except InvalidPlan:
            continue
        out[plan.solver] = {"peak_bytes": plan.peak_bytes, "overhead_seconds": plan.added_seconds - base}
    return out


# --- the smallest feasible budget, and the error below it ----------------------


def breakdown_at_peak(problem: Problem, solution: Solution) -> dict[str, int]:
    """Bytes alive at the plan's peak step, by category, largest first. They sum to the
    plan's peak: the same intervals as the simulator's timeline (``alive_at``)."""
    line = solution.timeline or evaluate(problem, solution.saved).timeline
    step = max(range(len(line)), key=line.__getitem__)
    parts: dict[str, int] = defaultdict(int)
    for value, why, nbytes in alive_at(problem, solution.saved, solution.recomputed, step):
        parts[category(value, why, step)] += nbytes
    parts["op workspace"] += step_workspace(problem, solution.recomputed, exact_starts(problem, solution.recomputed))[step]
    for what, nbytes in (*problem.outside, *(problem.handoff if handoff_step(problem) == (step, step) else ())):
        parts[what] += nbytes
    parts["other copies' kept activations"] += copies_kept_bytes(problem, solution.saved)
    return dict(sorted(((k, b) for k, b in parts.items() if b), key=lambda kv: -kv[1]))


def category(value: Value, why: str, step: int) -> str:
    if value.kind is Kind.INPUT:
        return "graph inputs (parameters, buffers, batch)"
    if value.kind is Kind.BACKWARD:
        return "backward values and gradients"
    if why == "recomputed":
        return "recomputed activations"
    if why == "kept" and step > value.last_use:
        return "kept activations that cannot be recomputed" if value.recompute_ban else "kept activations"
    return "forward values in use"


def min_budget_bytes(min_peak: int, headroom: float | None) -> int:
    """The smallest budget whose planned part fits ``min_peak``, a ``headroom`` fraction held back."""
    return math.ceil(min_peak / (1 - headroom)) if headroom else min_peak


def min_budget_gb(nbytes: int) -> float:
    """The smallest budget_gb, rounded up to 4 significant digits, that admits ``nbytes``.

    >>> min_budget_gb(2**30 + 1)
    1.001
    """
    gib = nbytes / GIB
    scale = 10 ** (3 - math.floor(math.log10(gib))) if gib > 0 else 1
    return math.ceil(gib * scale) / scale


def infeasible(problem: Problem, budget: int, lowest: Solution, headroom: float | None) -> BudgetError:
    """The error for ``budget`` below the model's smallest peak (``lowest``)."""
    parts = breakdown_at_peak(problem, lowest)
    top = ", ".join(f"{name} {format_bytes(b)}" for name, b in list(parts.items())[:3])
    proven = lowest.status is Status.OPTIMAL and not lowest.shared_blocks
    early = "" if lowest.status is Status.OPTIMAL else (
        f" The search for the minimum stopped early ({lowest.status.value}): a longer time_limit_s may find a lower one.")
    if proven and lowest.gap:  # proven within the search's gap, not to the byte
        early = f" (The model's minimum is proven within {lowest.gap:.1%} of it.)"
    if lowest.shared_blocks and lowest.status is Status.OPTIMAL:
        early = (f" (The search gave {lowest.shared_blocks} identical blocks one set of decisions: the least among "
                 f"such plans; a plan whose blocks differ may fit a little lower.)")
    return budget_error(budget, min_budget_bytes(lowest.peak_bytes, headroom), headroom,
                        f"at its smallest peak: {top}", proven=proven, tail=early)


def budget_error(budget: int, smallest: int, headroom: float | None, why: str, *, proven: bool = True,
                 under: str = "", tail: str = "") -> BudgetError:
    """The one message for a budget below the smallest feasible one: what that is, why,
    and what to do. ``under``: the compiler whose program was judged, if any."""
    which = "the smallest feasible budget" if proven else "the smallest budget found feasible"
    held = f", with {headroom:.0%} held back as headroom" if headroom else ""
    where = f" under {under}" if under else ""
    return BudgetError(
        f"budget {format_bytes(budget)} is below {which} {format_bytes(smallest)} for this graph{where}"
        f"{held} ({why}). Raise budget_gb to at least {min_budget_gb(smallest)!r}, "
        f"or shrink the batch or sequence.{tail}",
        budget_bytes=budget,
        min_feasible_bytes=smallest,
    )
