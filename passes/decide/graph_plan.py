"""The record of one graph's plan, and the figures computed when first read.

:class:`GraphPlan` is what remat decided, predicted and learned for one joint graph
(``passes/decide/partition.py`` makes it, ``passes/program/fit.py`` makes it again with its compiled
program's account, ``remat/report.py`` reads it). The smallest feasible budget, torch's own min-cut plan and the
peers' rules are computed only when a report reads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch.fx as fx

from remat.solvers.errors import BudgetError, format_bytes
from remat.solvers.lazy import Deferred, Deferring, Once
from remat.solvers.plan import Lowest, min_budget_bytes, peer_plan, peer_rules, score_peer, solve
from remat.solvers.problem import Problem
from remat.solvers.solution import Solution

from .. import torch_adapter as adapter
from ..program.known_programs import ProgramAccount
from ..capture.names import NodeName
from ..scope.rank_scope import RankScope
from .request import PlanRequest

MIN_FEASIBLE = ("min_feasible_bytes", "min_feasible_exact", "min_feasible_solve_seconds")
MIN_CUT = ("min_cut_peak_bytes", "min_cut_overhead_seconds", "min_cut_seconds")
# torch's min-cut decision needs the joint graph, which a program loaded whole never traces
NO_MIN_CUT = {"min_cut_peak_bytes": None, "min_cut_overhead_seconds": None, "min_cut_seconds": 0.0}
PEER_RULES = ("peer_rules",)


MinCut = Once[tuple[list[str], float]]  # torch's saved node names, and the seconds it took


@dataclass(eq=False)
class Realized:
    """The partitioned graphs torch built, checked against the plan (``attempt.check_realized``):
    filled once, when the backward arrives (with the forward under Inductor, at its first call op
    by op), so a plan handed out before that learns it then. ``done`` also for a program loaded
    whole, whose graphs never arrive."""

    done: bool = False
    peak_bytes: int | None = None  # what the realized graphs peak at, run op by op
    notes: tuple[str, ...] = ()

    def fill(self, peak_bytes: int | None, notes: tuple[str, ...] = ()) -> None:
        if self.done:
            raise RuntimeError("remat checked one plan's partitioned graphs twice; please report this")
        self.done, self.peak_bytes, self.notes = True, peak_bytes, notes


@dataclass(frozen=True, eq=False)
class GraphPlan(Deferring):
    """Everything remat decided, predicted and learned for one joint graph: a record never changed
    once made. A stage that learns more (the compiled program's account, the eager parts measured
    on the first step) makes a new record with :meth:`revised`; remat's ``Report`` is built from
    it (``remat.report.report_of``). Two things fill in after it is made, without changing what it
    says: the figures computed when first read (``FIGURES``: ``Deferred`` fields, see
    ``remat.solvers.lazy``) and the check of the graphs torch built from it (``realized``), which
    may arrive at the backward's first call.
    """

    problem: Problem
    solution: Solution
    store_all: Solution
    request: PlanRequest
    target: int | None  # the peak the plan must fit: the budget less any headroom (None: no budget)
    forward_names: frozenset[str]
    random_names: frozenset[str]
    lowest: Lowest  # the smallest-peak plan, solved when first asked for
    min_cut: MinCut | None = None  # torch's own decision, made when first asked for (None: no joint graph)
    profile_seconds: float = 0.0
    # wall seconds by phase of this graph's compile (capture, profile, solve, inductor), in order
    timings: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    plan_cache: str = ""  # "stored" when written to the plan cache, "hit" when loaded from it
    cache_key: Mapping[str, object] | None = None  # the plan cache key it was stored under
    compiled_peak_bytes: int | None = None  # what the program Inductor generated peaks at
    # that program's own account (compiled_peak_bytes adds the step's other memory); a plan loaded from
    # the plan cache knows only what the forward hands the backward (its peak_bytes None)
    program: ProgramAccount | None = None
    compile_attempts: int = 0
    rank: int = 0  # under torch.distributed: this process's rank, and how many ranks agreed on the plan
    world_size: int = 1
    node_order: tuple[str, ...] = ()  # the joint graph's node names, in order
    # the user's names for its nodes, by node name: module, parameter, source line (passes/capture/names.py)
    names: Mapping[str, NodeName] = field(default_factory=dict)
    scope: RankScope | None = None  # what the rank holds outside the graph, under a per-rank budget
    realized: Realized = field(default_factory=Realized)
    # AOTAutograd's cache entry for the plan's program, made while it compiled and not yet written
    # (passes/cache/program_cache.py writes it under the plan's key once the plan is accepted)
    program_entry: object | None = None
    # adds whose matmul Inductor would fold into them, kept apart (passes/modeling/problem.py, fold_holds_more)
    unfolded: frozenset[str] = frozenset()
    # the figures computed when first read (FIGURES), or set where they are known already
    min_feasible_bytes: int = Deferred(0)
    min_feasible_exact: bool = Deferred(False)
    min_feasible_solve_seconds: float = Deferred(0.0)
    min_cut_peak_bytes: int | None = Deferred(None)
    min_cut_overhead_seconds: float | None = Deferred(None)
    min_cut_seconds: float = Deferred(0.0)
    peer_rules: dict[str, dict[str, float]] | None = Deferred(None)

    def revised(self, **changes: object) -> GraphPlan:
        """A new record: this one with ``changes`` (figures not computed yet stay so, computed once for
        both when either reads them). ``dataclasses.replace`` would compute them all."""
        new = self._copy()
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new

    def noted(self, *notes: str) -> GraphPlan:
        """A new record with ``notes`` added (each once)."""
        added = tuple(n for n in dict.fromkeys(notes) if n not in self.notes)
        return self.revised(notes=self.notes + added) if added else self

    def timed(self, phase: str, seconds: float) -> GraphPlan:
        """A new record with ``seconds`` spent in ``phase`` (after the phases timed before)."""
        return self.revised(timings={**self.timings, phase: seconds})

    def deferring(self, compute: Callable[[], dict[str, object]], *names: str) -> GraphPlan:
        """A new record whose figures ``names`` are computed by ``compute`` when first read."""
        new = self.revised()
        new.defer(compute, *names)
        return new

    @property
    def complete(self) -> bool:
        """Both partitioned graphs were seen and checked (or none will come: a program loaded whole)."""
        return self.realized.done

    @property
    def realized_peak_bytes(self) -> int | None:
        return self.realized.peak_bytes

    @property
    def all_notes(self) -> tuple[str, ...]:
        """The plan's notes and those of the check of its realized graphs."""
        return self.notes + self.realized.notes

    @property
    def smallest(self) -> bool:
        """The plan is the smallest-peak plan: nothing tighter exists in the model."""
        low = self.lowest()
        return self.solution.saved == low.saved and self.solution.recomputed == low.recomputed

    @property
    def workspace_by_node(self) -> dict[str, int]:
        """Each op's measured scratch bytes, by node name (those with any)."""
        return {n: w for n, w in zip(self.problem.step_names, self.problem.workspace) if w}


FIGURES = GraphPlan.deferred_fields()  # a plan's figures computed when first read (the groups above, together)




def min_feasible_figures(lowest: Solution, request: PlanRequest) -> dict[str, object]:
    """The smallest feasible budget by the model: exact op by op, an estimate under Inductor."""
    return {"min_feasible_bytes": min_budget_bytes(lowest.peak_bytes, request.solve.headroom),
            "min_feasible_exact": request.compiler == "eager", "min_feasible_solve_seconds": lowest.solve_seconds}


def torch_min_cut(joint_graph: fx.Graph, node_info: adapter.NodeInfo) -> MinCut:
    """torch's own decision for the graph (its default partitioner), made when first asked for."""

    def decide() -> tuple[list[str], float]:
        t0 = time.perf_counter()
        saved = adapter.min_cut_saved_values(joint_graph, node_info)
        return [n.name for n in saved], time.perf_counter() - t0

    return Once(decide)


def min_cut_figures(problem: Problem, min_cut: MinCut) -> dict[str, object]:
    """torch's own plan for the graph, scored by remat's model."""
    names, seconds = min_cut()
    peak, added = score_peer(problem, names, "torch-min-cut")
    return {"min_cut_peak_bytes": peak, "min_cut_overhead_seconds": added, "min_cut_seconds": seconds}


def min_cut_candidates(problem: Problem, min_cut: MinCut) -> list[Solution]:
    """torch's plan as a candidate for a binding budget: remat's plan is never slower under the model."""
    plan = peer_plan(problem, min_cut()[0], "torch-min-cut")
    return [] if plan is None else [plan]


def defer_min_feasible(plan: GraphPlan) -> None:
    """The model's smallest feasible budget, on a plan being made: now if the smallest-peak plan is
    solved already (the budget bound), else when first read."""
    request, lowest = plan.request, plan.lowest
    if lowest.done:
        for name, value in min_feasible_figures(lowest(), request).items():
            object.__setattr__(plan, name, value)
    else:
        plan.defer(lambda: min_feasible_figures(lowest(), request), *MIN_FEASIBLE)


def defer_figures(plan: GraphPlan, known: set[str] = frozenset()) -> None:
    """On a plan being made: the smallest feasible budget, torch's min-cut plan and the peers' rules
    in the model, computed from its problem when first read (those not ``known`` already, for a plan
    from the cache; torch's figures only where it has torch's decision)."""
    problem, min_cut = plan.problem, plan.min_cut
    if not set(MIN_FEASIBLE) <= known:
        defer_min_feasible(plan)
    if not set(MIN_CUT) <= known and min_cut is not None:
        plan.defer(lambda: min_cut_figures(problem, min_cut), *MIN_CUT)
    if not set(PEER_RULES) <= known:
        plan.defer(lambda: {"peer_rules": peer_rules(problem)}, *PEER_RULES)


def plan_at(base: GraphPlan, budget_bytes: int | None) -> GraphPlan | BudgetError:
    """``base``'s profiled problem solved again at ``budget_bytes`` (``remat.sweep``): nothing
    is captured or profiled again, the smallest-peak plan is shared (solved at most once for
    every budget), and so are torch's min-cut figures."""
    request = replace(base.request, solve=replace(base.request.solve, budget_bytes=budget_bytes))
    try:
        solution, store_all = solve(base.problem, request.solve, base.lowest)
    except BudgetError as exc:
        return exc
    plan = GraphPlan(base.problem, solution, store_all, request, request.solve.target, base.forward_names,
                     base.random_names, base.lowest, base.min_cut, names=base.names, **base.known(MIN_CUT))
    plan.defer_from(base, MIN_CUT)
    defer_min_feasible(plan)
    return plan


STEP_NOTE = "the budget bounds the step: counted "


def scope_note(scope: RankScope | None, world_size: int, budget_scope: str) -> str | None:
    """What a budget bounds for this graph, when that is not simply the graph's whole step."""
    if scope is not None and scope.process:
        eager = (f"{format_bytes(scope.eager_bytes)} reserved for the eager code after the graph (three times its "
                 "outputs that a backward reaches, as wide as a head outside it makes them: a loss outside the "
                 "model), measured on the first step and counted from "
                 "the next" if scope.eager_reserved else
                 f"{format_bytes(scope.eager_bytes)} of eager code after the graph (such as a loss computed outside "
                 "the model), measured on the first step")
        return f"{STEP_NOTE}{eager}"
    if scope is not None:
        return (f"the budget bounds the rank's step ({scope.wrapper}): counted {format_bytes(scope.resident_bytes)} "
                f"resident, {format_bytes(scope.comm_bytes)} of communication buffers and {scope.copies} other "
                "copies of this graph's kept activations and inputs"
                + (f", {format_bytes(scope.eager_bytes)} reserved for the eager head and loss (three times this "
                   "graph's outputs, as wide as a head outside it makes them), measured on the first step and "
                   "counted from the next" if scope.eager_reserved else
                   f", {format_bytes(scope.eager_bytes)} of eager head and loss" if scope.eager_bytes else
                   "; the eager head and loss are measured on the first step and counted from the next"))
    if world_size > 1:
        return ("the budget bounds this graph's own step (budget_scope=\"graph\"): memory the rank holds outside "
                "it (other graphs' kept activations, FSDP's unsharded parameters and buffers, shards, eager code) "
                "is not counted")
    return None


def one_line(plan: GraphPlan) -> str:
    """A log line: the plan's peak, store-all's, and what it recomputes."""
    return (f"predicted peak {format_bytes(plan.solution.peak_bytes)} (store-all "
            f"{format_bytes(plan.store_all.peak_bytes)}), {len(plan.solution.recomputed)} values recomputed, "
            f"solver {plan.solution.solver} ({plan.solution.status.value})")
