"""Partition pass: decide the saved set of each joint graph, and check the result.

:class:`Planner` is what torch's partitioner calls (through
``torch_adapter.saved_values_chooser``) for each joint graph: it profiles
the graph, builds the :class:`Problem`, solves it under the budget and
hands back the nodes to save. torch then builds the forward and backward
graphs, recomputing in the backward every forward value it needs and was
not handed, just before its first use. When those graphs arrive for
compilation the planner checks them against the plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch.fx as fx

from remat import solvers
from remat.budget import infeasible, min_budget_bytes
from remat.errors import BudgetError, PlanError, format_bytes
from remat.lazy import Once
from remat.options import Options
from remat.report import Report, attach_timelines, node_rows
from remat.solvers.problem import Kind, Problem
from remat.solvers.solution import Solution, Status

from . import plan_cache
from . import torch_adapter as adapter
from .memory import realized_peak, recomputed_in
from .problem import build_problem
from .profile import SHARED_TIMINGS, profile_graph

log = logging.getLogger(__name__)


class PlanComplete(Exception):
    """Stops compilation once a graph is planned (``remat.plan`` runs nothing)."""


@dataclass
class GraphPlan:
    """Everything remat decided and predicted for one joint graph."""

    problem: Problem | None  # None for a plan loaded from the plan cache
    solution: Solution
    report: Report
    forward_names: set[str]
    random_names: set[str]
    graphs: dict[str, fx.GraphModule] = field(default_factory=dict)
    lowest: Lowest | None = None  # the smallest-peak plan, solved when first asked for

    @property
    def smallest(self) -> bool:
        """The plan is the smallest-peak plan: nothing tighter exists in the model."""
        if self.lowest is None:
            return False
        low = self.lowest()
        return self.solution.saved == low.saved and self.solution.recomputed == low.recomputed


def planning_target(problem: Problem, options: Options) -> int | None:
    """The peak the plan itself must fit: the budget less a user's headroom fraction, or less
    the margin for memory no account sees (``unseen_margin``)."""
    budget = options.budget_bytes
    if budget is None:
        return None
    if options.headroom is not None:
        return int(budget * (1 - options.headroom))
    return budget - unseen_margin(problem, options.compiler)


def unseen_margin(problem: Problem, compiler: str) -> int:
    """Bytes held back for memory no account sees. None: op by op the model adds each op's
    measured workspace at its step; under Inductor the compiled account adds each extern
    kernel's measured scratch at the line it runs (``passes/fit.py``)."""
    return 0


Lowest = Once[Solution]  # the smallest-peak plan, solved on the first call


def solve(problem: Problem, options: Options, lowest: Lowest | None = None, *,
          target: int | None = None, settle_for_lowest: bool = False) -> tuple[Solution, Solution]:
    """(plan, store-all); raises BudgetError below the minimum.

    ``lowest``: the smallest-peak plan, called only where it is needed: a binding budget
    (is it feasible?) or a failed solve (a fall-back). With no budget, or one at or above
    store-all's peak, it is never solved here (issue 12). Default: solved here when needed.
    ``target``: the peak the plan must fit (default: ``planning_target``).
    ``settle_for_lowest``: below the model's minimum, return the smallest-peak plan
    instead of raising (Inductor's program is then compiled and judged by its own account).
    """
    budget = planning_target(problem, options) if target is None else target
    config = ilp_config(options)
    store_all = solvers.store_all(problem)
    lowest = lowest or Once(lambda: smallest_peak(problem, config))
    # store-all's peak is at least the smallest: only a budget below it can be infeasible
    if budget is not None and budget < store_all.peak_bytes and budget < lowest().peak_bytes:
        if settle_for_lowest:
            note = "below the model's smallest peak: the smallest-peak plan, judged by its compiled program"
            return replace(lowest(), notes=(*lowest().notes, note)), store_all
        raise infeasible(problem, options.budget_bytes, lowest(), options.headroom,
                         unseen_margin(problem, options.compiler))
    # No plan holds more than keeping everything: a budget at or above that
    # peak (or none) is never binding, and every such budget gets one plan.
    cap = store_all.peak_bytes if budget is None else min(budget, store_all.peak_bytes)
    plan = solve_or_fall_back(problem, cap, options, config, lowest)
    if plan.status is Status.FEASIBLE:
        gap = "unknown" if plan.gap is None else f"{plan.gap:.2%}"
        note = (f"time limit of {options.time_limit_s:g} s reached: the best plan found "
                f"(gap to optimal {gap}); raise time_limit_s for a faster one")
        plan = replace(plan, notes=(*plan.notes, note))
    return plan, store_all


def ilp_config(options: Options) -> solvers.ILPConfig:
    return solvers.ILPConfig(time_limit_s=options.time_limit_s)


def smallest_peak(problem: Problem, config: solvers.ILPConfig) -> Solution:
    """The min-peak ILP's plan, or store-all where that peaks lower (any valid plan
    bounds the smallest peak; the ILP's may be time-limited); if the ILP fails,
    the lowest cheap plan (an upper bound), noted."""
    try:
        return min(solvers.min_peak(problem, config=config), solvers.store_all(problem), key=lambda s: s.peak_bytes)
    except Exception as exc:  # a solver fault must not lose the plan: see solve_or_fall_back
        reason = f"the smallest-peak solve failed ({type(exc).__name__}: {exc})"
        log.warning("remat: %s; the smallest feasible budget is a cheap plan's, an upper bound", reason)
        plan = min(cheap_plans(problem, 0), key=lambda s: s.peak_bytes)
        return replace(plan, status=Status.FALLBACK, notes=(*plan.notes, f"{reason}; bound from {plan.solver}"))


def solve_or_fall_back(problem: Problem, cap: int, options: Options, config: solvers.ILPConfig,
                       lowest: Lowest) -> Solution:
    """The chosen solver's plan within ``cap``; if the solver raises or its
    plan does not fit, the fastest plan that fits among the cheap ones and
    the smallest-peak plan ``lowest()``, with status FALLBACK and the reason noted.

    Near the smallest peak the solver may stop at its time limit with no
    plan, or (where a value's earliest starts merge into one segment) count
    a plan above the exact memory, while ``lowest`` fits.
    """
    solver = solvers.get(options.solver)
    kwargs = {"config": config} if options.solver.startswith("ilp") else {}
    cause: Exception | None = None
    try:
        plan = solver.solve(problem, cap, **kwargs)
        if plan.peak_bytes <= cap:
            return plan
        reason = f"solver {options.solver!r} found no plan within {format_bytes(cap)} (its plan peaks at " \
                 f"{format_bytes(plan.peak_bytes)})"
    except solvers.Infeasible as exc:  # near the smallest peak: see the docstring
        reason, cause = f"solver {options.solver!r} found no plan within {format_bytes(cap)}", exc
    except Exception as exc:  # any fault inside a solver library: never lose the step over it
        reason, cause = f"solver {options.solver!r} failed ({type(exc).__name__}: {exc})", exc
    fits = [p for p in [*cheap_plans(problem, cap), lowest()] if p.peak_bytes <= cap]
    if not fits:
        raise PlanError(f"{reason}, and no cheap plan fits {format_bytes(cap)}: raise the budget, "
                        f"or try another solver ({', '.join(solvers.available())})") from cause
    plan = min(fits, key=lambda s: s.added_seconds)
    log.warning("remat: %s; using the %s plan", reason, plan.solver)
    return replace(plan, status=Status.FALLBACK, notes=(*plan.notes, f"{reason}; used the {plan.solver} plan"))


def cheap_plans(problem: Problem, budget: int) -> list[Solution]:
    """Plans made without an ILP: store-all, greedy toward ``budget``, recompute-all."""
    return [solvers.store_all(problem), solvers.greedy(problem, budget), solvers.recompute_all(problem)]


def min_cut_kept(problem: Problem, saved: list[fx.Node]) -> set[str]:
    """torch's saved set in the model's terms.

    torch may save a view; keeping a view keeps its base's storage, which is
    what the model's plan says when it keeps the base.
    """
    values = problem.by_name()
    kept = set()
    for name in (n.name for n in saved):
        while name in values and not values[name].savable and values[name].operands:
            name = values[name].operands[0]
        if name in values and values[name].is_candidate and values[name].savable:
            kept.add(name)
    return kept


def score_min_cut(problem: Problem, saved: list[fx.Node]) -> tuple[int | None, float]:
    """(peak, added seconds) of torch's own choice under remat's model.

    The time always has a value; the peak is ``None`` where torch recomputes
    chains the model only bounds when the operand is kept.
    """
    kept = min_cut_kept(problem, saved)
    recomputed = solvers.closure(problem, kept)
    seconds = solvers.added_seconds(problem, kept, recomputed)
    try:
        return solvers.evaluate(problem, kept, solver="torch-min-cut").peak_bytes, seconds
    except ValueError as exc:
        log.debug("min-cut plan's peak not expressible in the model: %s", exc)
        return None, seconds


def nodes_to_save(graph: fx.Graph, node_info: adapter.NodeInfo, solution: Solution) -> list[fx.Node]:
    """The plan's kept values, plus what is free to hand over: graph inputs and sizes.

    torch drops any handed-over value the backward does not read.
    """
    inputs = set(node_info.inputs)
    keep = []
    for node in graph.nodes:
        if node.name in solution.saved or node in inputs:
            keep.append(node)
        elif node_info.is_required_fw(node) and adapter.is_sym_node(node):
            keep.append(node)
    return keep


class Planner:
    """Plans every joint graph of one compiled model, and keeps the reports."""

    def __init__(self, options: Options, *, stop_after_plan: bool = False) -> None:
        self.options = options
        self.stop_after_plan = stop_after_plan
        self.plans: list[GraphPlan] = []
        # Set by the fitting loop (passes/fit.py) between compiles of one graph:
        # the peak the next plan must fit, and whether a target below the model's
        # smallest peak yields the smallest-peak plan (judged by its compiled program).
        self.target: int | None = None
        self.settle_for_lowest = False
        # Off while plans are compiled only to measure them (passes/fit.py): the plan cache
        # keeps the plan that fitted the budget, never a fall-back made for a figure.
        self.storing = True
        # one cache per process: planning and compiling the same model then
        # see the same costs (CPU workspace, in particular, varies run to run)
        self.cache = SHARED_TIMINGS
        # The fitting loop plans one graph several times, each from an equal problem:
        # its smallest-peak plan is solved once (a few graphs' worth: graph breaks).
        self.lowest_by_problem: dict[Problem, Once[Solution]] = {}
        folder = plan_cache.cache_dir(options.plan_cache)
        self.disk = plan_cache.PlanCache(folder) if folder is not None else None

    @property
    def reports(self) -> list[Report]:
        return [p.report for p in self.plans]

    def choose(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo) -> list[fx.Node]:
        # A plan holds for the sizes it was made at: under a budget, dynamic
        # sizes are pinned (guarded), so another size compiles and plans anew.
        specialized = self.options.budget_bytes is not None and adapter.specialize_sizes(joint_graph)
        forward = {n.name for n in joint_graph.nodes if node_info.is_required_fw(n)}
        key = cached = None
        if self.disk is not None:
            # the fitting loop's last plan is stored under the default key: the next
            # process starts from the plan that fitted
            key = plan_cache.graph_key(joint_graph, self.options, plan_cache.graph_device(joint_graph))
            cached = self.disk.load(key, joint_graph) if self.target is None else None
        if cached is not None:
            plan = plan_from_cache(cached, forward)
            problem = Once(lambda: self.profiled(joint_graph, node_info)[0])  # only if a figure asks for it
            self.defer_figures(plan.report, problem, Once(lambda: self.lowest_of(problem())()),
                               joint_graph, node_info, only=cached.pending)
        else:
            plan = self.make_plan(joint_graph, node_info, forward)
            if specialized:
                plan.report.notes.append("dynamic sizes pinned: each new size is planned under the budget again")
            if key is not None and self.storing:  # the plan cache is on
                self.store(key, plan)
        self.plans.append(plan)
        if log.isEnabledFor(logging.INFO):  # the summary reads every figure: compute them only for the log
            log.info("remat plan for graph %d:\n%s", len(self.plans) - 1, plan.report.summary())
        if self.stop_after_plan:
            raise PlanComplete
        return nodes_to_save(joint_graph, node_info, plan.solution)

    def store(self, key: dict[str, object], plan: GraphPlan) -> None:
        plan.report.plan_cache = "stored"
        entry = plan_cache.CachedPlan(plan.solution.saved, plan.solution.recomputed, frozenset(plan.random_names),
                                      plan.report)
        if not self.disk.store(key, entry):
            plan.report.plan_cache = ""

    def profiled(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo) -> tuple[Problem, dict]:
        """The graph's problem, and the costs profiled for it."""
        costs = profile_graph(joint_graph, mode=self.options.profile, cache=self.cache)
        return build_problem(joint_graph, node_info, costs, fusion=self.options.compiler == "inductor"), costs

    def lowest_of(self, problem: Problem) -> Once[Solution]:
        """The smallest-peak plan of ``problem``, solved on first call, once per equal problem."""
        if problem not in self.lowest_by_problem:
            config = ilp_config(self.options)
            self.lowest_by_problem[problem] = Once(lambda: smallest_peak(problem, config))
            while len(self.lowest_by_problem) > 4:
                del self.lowest_by_problem[next(iter(self.lowest_by_problem))]
        return self.lowest_by_problem[problem]

    def make_plan(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo, forward: set[str]) -> GraphPlan:
        """Profile, build the problem and solve; figures the plan does not need wait until read."""
        t0 = time.perf_counter()
        problem, costs = self.profiled(joint_graph, node_info)
        profile_seconds = time.perf_counter() - t0
        lowest = self.lowest_of(problem)
        plan, store_all = solve(problem, self.options, lowest, target=self.target,
                                settle_for_lowest=self.settle_for_lowest)
        report = make_report(problem, plan, store_all, self.options)
        if self.target is not None:
            report.notes.append(f"planned to {format_bytes(self.target)} so that the compiled program fits")
        attach_timelines(report, problem, plan, store_all)
        report.profile_seconds = profile_seconds
        self.defer_figures(report, lambda: problem, lowest, joint_graph, node_info)
        random = {n.name for n in joint_graph.nodes if costs.get(n.name) and costs[n.name].kind == "random"}
        return GraphPlan(problem, plan, report, forward, random, lowest=lowest)

    def defer_figures(self, report: Report, problem: Callable[[], Problem], lowest: Lowest, joint_graph: fx.Graph,
                      node_info: adapter.NodeInfo, only: Sequence[str] | None = None) -> None:
        """The smallest feasible budget and torch's min-cut plan, computed when first read
        (``only``: those of these fields still to compute)."""

        def kept(names: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(n for n in names if only is None or n in only)

        defer_min_feasible(report, lowest, self.options, kept(MIN_FEASIBLE))
        report.defer(lambda: min_cut_figures(problem(), joint_graph, node_info), *kept(MIN_CUT))

    def on_graph(self, gm: fx.GraphModule, kind: str) -> None:
        """Called with each partitioned graph before it is compiled.

        With graph breaks every forward compiles before any backward, and the
        backwards come in reverse order: a backward is matched to the plan
        whose forward hands over the values it reads.
        """
        plan = owner_of(gm, kind, self.plans)
        if plan is None:
            return  # an inference graph: nothing was planned
        plan.graphs[kind] = gm
        if kind == "backward":
            check_realized(plan, self.options)


def plan_from_cache(cached: plan_cache.CachedPlan, forward: set[str]) -> GraphPlan:
    """A GraphPlan from disk: the decision and report, no problem (nothing was profiled)."""
    report = cached.report
    report.plan_cache = "hit"
    solution = Solution(solver=report.solver, saved=cached.saved, recomputed=cached.recomputed,
                        peak_bytes=report.predicted_peak_bytes, timeline=(),
                        added_seconds=report.predicted_overhead_seconds, status=Status(report.solver_status),
                        bound=None, gap=report.mip_gap, solve_seconds=0.0)
    return GraphPlan(None, solution, report, forward, set(cached.random))


def owner_of(gm: fx.GraphModule, kind: str, plans: list[GraphPlan]) -> GraphPlan | None:
    """The latest plan still waiting for a graph of this kind that fits it."""
    waiting = [p for p in plans if kind not in p.graphs and (kind == "forward" or "forward" in p.graphs)]
    if kind == "forward":
        return waiting[-1] if waiting else None
    reads = {n.name for n in gm.graph.find_nodes(op="placeholder") if not adapter.is_tangent(n)}
    for plan in reversed(waiting):
        handed = {n.name for n in plan.graphs["forward"].graph.find_nodes(op="output")[0].all_input_nodes}
        if reads <= handed:
            return plan
    return None


def check_realized(plan: GraphPlan, options: Options) -> None:
    """The graphs torch built must do what the plan says (DESIGN's self-check)."""
    forward, backward = plan.graphs["forward"], plan.graphs["backward"]
    again = recomputed_in(backward, plan.forward_names)
    if again & plan.random_names:
        raise PlanError(f"random ops would be recomputed with fresh randomness: {sorted(again & plan.random_names)}")
    extra = again - plan.solution.recomputed
    if extra:
        plan.report.notes.append(f"backward recomputes {len(extra)} values the plan keeps or frees: {sorted(extra)[:5]}")
    peak = realized_peak(forward, backward)
    plan.report.realized_peak_bytes = peak
    # Unfused, the realized graphs must peak where the plan says; Inductor's
    # fusion makes the prediction lower than this op-by-op figure on purpose.
    if options.compiler == "eager" and peak > plan.report.predicted_peak_bytes:
        plan.report.notes.append(
            f"realized graphs peak at {peak} bytes, above the predicted {plan.report.predicted_peak_bytes}"
        )
        log.warning(plan.report.notes[-1])
        budget = options.budget_bytes
        if budget is not None and peak > budget:  # op by op, this peak is the one the step will reach
            raise PlanError(f"the partitioned graphs would peak at {peak} bytes, over the budget of {budget}; "
                            f"please report this graph, and meanwhile pass headroom= to plan below the budget")


def make_report(problem: Problem, plan: Solution, store_all: Solution, options: Options) -> Report:
    """The plan's report; the figures that need more than the plan come later (``defer_figures``)."""
    margin = 0 if options.headroom is not None else unseen_margin(problem, options.compiler)
    return Report(
        budget_bytes=options.budget_bytes,
        predicted_peak_bytes=plan.peak_bytes,
        planned_budget_bytes=planning_target(problem, options),
        headroom=options.headroom or 0.0,
        margin_bytes=margin,
        input_bytes=sum(v.bytes for v in problem.values if v.kind is Kind.INPUT),
        store_all_peak_bytes=store_all.peak_bytes,
        predicted_overhead_seconds=plan.added_seconds - store_all.added_seconds,
        solver=plan.solver,
        solver_status=str(plan.status.value),
        solve_seconds=plan.solve_seconds,
        mip_gap=plan.gap,
        nodes=node_rows(problem, plan),
        device=str(problem.meta.get("device", "")),
        joint_graph_steps=problem.num_steps,
        candidates=len(problem.candidates()),
        notes=list(plan.notes),
    )


MIN_FEASIBLE = ("min_feasible_bytes", "min_feasible_exact", "min_feasible_solve_seconds")
MIN_CUT = ("min_cut_peak_bytes", "min_cut_overhead_seconds", "min_cut_seconds")


def defer_min_feasible(report: Report, lowest: Lowest, options: Options,
                       names: tuple[str, ...] = MIN_FEASIBLE) -> None:
    """The model's smallest feasible budget, computed when first read. Already solved (the
    budget binds), it costs nothing now, and the plan cache then stores it."""
    report.defer(lambda: min_feasible_figures(lowest(), report, options), *names)
    if lowest.done:
        report.compute_pending(*names)


def min_feasible_figures(lowest: Solution, report: Report, options: Options) -> dict[str, object]:
    """The smallest feasible budget by the model: exact op by op, an estimate under Inductor."""
    return {"min_feasible_bytes": min_budget_bytes(lowest.peak_bytes, options.headroom, report.margin_bytes),
            "min_feasible_exact": options.compiler == "eager", "min_feasible_solve_seconds": lowest.solve_seconds}


def min_cut_figures(problem: Problem, joint_graph: fx.Graph, node_info: adapter.NodeInfo) -> dict[str, object]:
    """torch's own plan for the graph (its default partitioner), scored by remat's model."""
    t0 = time.perf_counter()
    saved = adapter.min_cut_saved_values(joint_graph, node_info)
    seconds = time.perf_counter() - t0
    peak, added = score_min_cut(problem, saved)
    return {"min_cut_peak_bytes": peak, "min_cut_overhead_seconds": added - solvers.store_all(problem).added_seconds,
            "min_cut_seconds": seconds}


def plan_budgets(problem: Problem, options: Options, budgets_gb: Sequence[float | None], lowest: Lowest, *,
                 min_cut: Callable[[], dict[str, object]] | None = None) -> list[Report | ValueError]:
    """One profiled problem solved at several budgets (``remat.sweep``): nothing is
    captured or profiled again, and the smallest-peak plan ``lowest()`` is solved at most
    once for all of them. A budget below the smallest feasible one gives its
    :class:`BudgetError` in place of a Report. ``min_cut``: torch's plan's figures, the
    same for every budget, computed when a report's are first read."""
    out: list[Report | ValueError] = []
    for budget_gb in budgets_gb:
        at = replace(options, budget_gb=budget_gb)
        try:
            plan, store_all = solve(problem, at, lowest)
        except BudgetError as exc:
            out.append(exc)
            continue
        report = make_report(problem, plan, store_all, at)
        defer_min_feasible(report, lowest, at)
        if min_cut is not None:
            report.defer(min_cut, *MIN_CUT)
        out.append(attach_timelines(report, problem, plan, store_all))
    return out
