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
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch.fx as fx

from remat.solvers.baselines import store_all
from remat.solvers.errors import BudgetError, PlanError, format_bytes
from remat.solvers.plan import Lowest, Once, lowest_of, min_budget_bytes, peer_plan, peer_rules, score_peer, solve
from remat.solvers.problem import Problem
from remat.solvers.simulate import evaluate
from remat.solvers.solution import Solution, Status

from . import plan_cache, ranks
from .rank_scope import RankScope
from . import torch_adapter as adapter
from .memory import realized_peak, recomputed_in
from .names import NodeName, names_of, names_of_inputs
from .policies import in_checkpoint_region
from .problem import build_problem, unfolded_adds
from .profile import SHARED_TIMINGS, profile_graph
from .request import PlanRequest

log = logging.getLogger(__name__)

Figures = Callable[[], dict[str, object]]


class PlanComplete(Exception):
    """Stops compilation once a graph is planned (``remat.plan`` runs nothing)."""


class ProgramMiss(Exception):
    """Stops a compile that was to load its program from AOTAutograd's cache (``passes/program_cache.py``)
    when torch's partitioner is reached instead: the cache did not have it."""


class Unwanted(Exception):
    """Stops a compile at the partitioner when ``Planner.wanted`` turns its plan down (the fitting
    loop, ``passes/fit.py``: a looser plan not faster, a plan whose program was compiled already):
    Inductor would compile it for nothing. Carries the plan, which was not kept."""

    def __init__(self, plan: GraphPlan) -> None:
        super().__init__("plan not wanted")
        self.plan = plan


@dataclass(eq=False)
class GraphPlan:
    """Everything remat decided, predicted and learned for one joint graph: plain data.

    The passes fill it while the graph is planned and compiled; remat's ``Report`` is
    built from it (``remat.report.report_of``). ``figures`` holds figures already
    known; ``deferred`` lists how to compute the others, (names, compute), when first
    read (a later entry for a name replaces an earlier one). ``complete``: both
    partitioned graphs were seen and checked; nothing changes after that but figures
    computed when read.
    """

    problem: Problem
    solution: Solution
    store_all: Solution
    request: PlanRequest
    target: int | None  # the peak the plan must fit: the budget less any headroom (None: no budget)
    forward_names: set[str]
    random_names: set[str]
    lowest: Lowest  # the smallest-peak plan, solved when first asked for
    profile_seconds: float = 0.0
    # wall seconds by phase of this graph's compile (capture, profile, solve, inductor), in order
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    plan_cache: str = ""  # "stored" when written to the plan cache, "hit" when loaded from it
    cache_key: dict[str, object] | None = None  # the plan cache key it was stored under
    compiled_peak_bytes: int | None = None  # what the program Inductor generated peaks at
    handoff_bytes: int | None = None  # alive when that program's forward returns: inputs, what it hands the backward
    program_peak_bytes: int | None = None  # that program's own peak (compiled_peak_bytes adds the step's other memory)
    program_peaks: tuple[int, int, int] | None = None  # its forward's and backward's peaks, the caller's outputs
    compile_attempts: int = 0
    rank: int = 0  # under torch.distributed: this process's rank, and how many ranks agreed on the plan
    world_size: int = 1
    node_order: list[str] = field(default_factory=list)  # the joint graph's node names, in order
    # the user's names for its nodes, by node name: module, parameter, source line (passes/names.py)
    names: dict[str, NodeName] = field(default_factory=dict)
    scope: RankScope | None = None  # what the rank holds outside the graph, under a per-rank budget
    realized_peak_bytes: int | None = None
    figures: dict[str, object] = field(default_factory=dict)
    deferred: list[tuple[tuple[str, ...], Figures]] = field(default_factory=list)
    graphs: dict[str, fx.GraphModule] = field(default_factory=dict)
    # AOTAutograd's cache entry for the plan's program, made while it compiled and not yet written
    # (passes/program_cache.py writes it under the plan's key once the plan is accepted)
    program_entry: object | None = None
    # adds whose matmul Inductor would fold into them, kept apart (passes/problem.py, fold_holds_more)
    unfolded: frozenset[str] = frozenset()

    @property
    def complete(self) -> bool:
        return "backward" in self.graphs

    @property
    def smallest(self) -> bool:
        """The plan is the smallest-peak plan: nothing tighter exists in the model."""
        low = self.lowest()
        return self.solution.saved == low.saved and self.solution.recomputed == low.recomputed

    @property
    def workspace_by_node(self) -> dict[str, int]:
        """Each op's measured scratch bytes, by node name (those with any)."""
        return {n: w for n, w in zip(self.problem.step_names, self.problem.workspace) if w}

    def defer(self, compute: Figures, *names: str) -> None:
        self.deferred.append((names, compute))
        for name in names:
            self.figures.pop(name, None)


MIN_FEASIBLE = ("min_feasible_bytes", "min_feasible_exact", "min_feasible_solve_seconds")
MIN_CUT = ("min_cut_peak_bytes", "min_cut_overhead_seconds", "min_cut_seconds")
# torch's min-cut decision needs the joint graph, which a program loaded whole never traces
NO_MIN_CUT = {"min_cut_peak_bytes": None, "min_cut_overhead_seconds": None, "min_cut_seconds": 0.0}
PEER_RULES = ("peer_rules",)


def min_feasible_figures(lowest: Solution, request: PlanRequest) -> dict[str, object]:
    """The smallest feasible budget by the model: exact op by op, an estimate under Inductor."""
    return {"min_feasible_bytes": min_budget_bytes(lowest.peak_bytes, request.solve.headroom),
            "min_feasible_exact": request.compiler == "eager", "min_feasible_solve_seconds": lowest.solve_seconds}


MinCut = Once[tuple[list[str], float]]  # torch's saved node names, and the seconds it took


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
    """The model's smallest feasible budget: now if the smallest-peak plan is solved
    already (the budget bound), else when first read."""
    if plan.lowest.done:
        plan.figures.update(min_feasible_figures(plan.lowest(), plan.request))
    else:
        plan.defer(lambda: min_feasible_figures(plan.lowest(), plan.request), *MIN_FEASIBLE)


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
                     base.random_names, base.lowest, deferred=[d for d in base.deferred if d[0] == MIN_CUT],
                     names=base.names)
    defer_min_feasible(plan)
    return plan


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
    """Plans every joint graph of one compiled model, and keeps the plans."""

    def __init__(self, request: PlanRequest, *, stop_after_plan: bool = False) -> None:
        self.request = request
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
        # Set by the fitting loop: whether a plan just made is to be compiled, or its compile stopped
        # (Unwanted): a looser plan not predicted enough faster, a plan whose program is known already
        self.wanted: Callable[[GraphPlan], bool] | None = None
        # the peak of each decision's program compiled for this planner (passes/fit.py): one is not
        # compiled twice to learn it
        self.program_peaks: dict[tuple, int] = {}
        # A plan made already, to hand out again at the next call (its graph compiled once more)
        self.replay: GraphPlan | None = None
        # True while a compile is to load its program whole (passes/program_cache.py): reaching
        # the partitioner means it was not there
        self.expect_program = False
        # set by the backend: the fitting loop's compiles record their AOTAutograd cache entries
        self.record_programs = False
        # Under torch.distributed, on ranks other than 0: rank 0's plan record and its joint
        # graph's node names, for the next graph (remat/backend.py)
        self.given: tuple[dict, list[str]] | None = None
        # Set by the backend for each graph: the rank's memory outside it (budget_scope "rank"), or None
        self.scope: RankScope | None = None
        # Set by the backend for each graph without a rank scope: bytes of the compiled module's
        # parameters and buffers the graph does not read (held through its step all the same)
        self.unread_state = 0
        # set by the backend (or the fitting loop) when the joint graph's capture begins
        self.capture_started: float | None = None
        # set by the backend for each graph: its inputs by the user's names (passes/names.py, input_names)
        self.input_names: dict = {}
        self.chosen_at = 0.0  # when the last saved set was handed to torch
        # one cache per process: planning and compiling the same model then
        # see the same costs (CPU workspace, in particular, varies run to run)
        self.cache = SHARED_TIMINGS
        # The fitting loop plans one graph several times, each from an equal problem:
        # its smallest-peak plan is solved once (a few graphs' worth: graph breaks).
        self.lowest_by_problem: dict[Problem, Lowest] = {}
        folder = request.plan_cache
        self.disk = plan_cache.PlanCache(folder) if folder is not None else None

    @staticmethod
    def names_of_inputs(gm: fx.GraphModule) -> dict:
        """The captured graph's inputs by the user's names, for ``input_names`` (passes/names.py)."""
        return names_of_inputs(gm)

    def choose(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo) -> list[fx.Node]:
        if self.expect_program:
            raise ProgramMiss
        entered = time.perf_counter()
        # A plan holds for the sizes it was made at: under a budget, dynamic
        # sizes are pinned (guarded), so another size compiles and plans anew.
        specialized = self.request.budget_bytes is not None and adapter.specialize_sizes(joint_graph)
        forward = {n.name for n in joint_graph.nodes if node_info.is_required_fw(n)}
        if self.replay is not None:  # the same graph compiled again (passes/fit.py): the same plan
            plan, self.replay = self.replay, None
            plan.graphs = {}
        elif self.given is not None:
            plan = self.plan_given(joint_graph, node_info, forward)
        else:
            plan = self.local_plan(joint_graph, node_info, forward, specialized)
            if self.wanted is not None and not self.wanted(plan):
                raise Unwanted(plan)
        plan.node_order = [n.name for n in joint_graph.nodes]
        plan.names = names_of(joint_graph, self.input_names)  # read from this graph: a cached plan's may differ
        if self.request.compiler == "inductor":  # the adds whose matmul Inductor must not fold (passes/problem.py)
            plan.unfolded = unfolded_adds(joint_graph, node_info)
        plan.scope = self.scope
        self.note_rank(plan)
        # (in a process's step scope they are its resident bytes)
        unread = self.unread_state or (plan.scope.resident_bytes if plan.scope is not None and plan.scope.process else 0)
        if unread:
            note = (f"counted {format_bytes(unread)} of the module's parameters and buffers that "
                    "this graph does not read (held through its step)")
            plan.notes += [] if note in plan.notes else [note]
        if self.capture_started is not None:
            plan.timings = {"capture": entered - self.capture_started, **plan.timings}
        self.plans.append(plan)
        log.info("remat plan for graph %d: %s", len(self.plans) - 1, one_line(plan))
        self.chosen_at = time.perf_counter()
        if self.stop_after_plan:
            raise PlanComplete
        return nodes_to_save(joint_graph, node_info, plan.solution)

    def plan_given(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo, forward: set[str]) -> GraphPlan:
        """The plan rank 0 compiled for this graph (``passes/ranks.py``), nothing profiled or solved."""
        (record, names), self.given = self.given, None
        cached = plan_cache.plan_of_record(ranks.in_own_names(record, names, joint_graph))
        plan = self.plan_from_cache(cached, forward, torch_min_cut(joint_graph, node_info))
        plan.plan_cache = "rank 0"
        plan.notes.append(f"saved set decided by rank 0 of {ranks.world()[1]} and sent to every rank")
        return plan

    def note_rank(self, plan: GraphPlan) -> None:
        plan.rank, plan.world_size = ranks.world()
        if self.request.budget_bytes is None:
            return
        note = scope_note(plan.scope, plan.world_size, self.request.budget_scope)
        if note is not None and note not in plan.notes:
            plan.notes.append(note)
        if note is not None and plan.scope is None:
            ranks.warn_once(note)

    def local_plan(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo, forward: set[str],
                   specialized: bool) -> GraphPlan:
        """The plan from the plan cache, or profiled and solved here (and stored)."""
        key = cached = None
        if self.disk is not None:
            # the fitting loop's last plan is stored under the default key: the next
            # process starts from the plan that fitted
            key = plan_cache.graph_key(joint_graph, self.request, plan_cache.graph_device(joint_graph))
            if self.scope is not None:  # planned for the rank: another rank layout is another plan
                key["rank_scope"] = self.scope.key()
            if self.unread_state:  # planned with other memory held: another plan
                key["unread_state_bytes"] = self.unread_state
            cached = self.disk.load(key, joint_graph) if self.target is None else None
        if cached is not None:
            return self.plan_from_cache(cached, forward, torch_min_cut(joint_graph, node_info))
        plan = self.make_plan(joint_graph, node_info, forward)
        if specialized:
            plan.notes.append("dynamic sizes pinned: each new size is planned under the budget again")
        if key is not None and self.storing:  # the plan cache is on
            plan.plan_cache = "stored" if self.disk.store(key, plan_cache.entry_of(plan)) else ""
            plan.cache_key = key
        return plan

    def profiled(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo) -> tuple[Problem, dict]:
        """The graph's problem, and the costs profiled for it."""
        costs = profile_graph(joint_graph, mode=self.request.profile, cache=self.cache,
                              cost_folder=self.request.cost_cache, inductor=self.request.compiler == "inductor")
        problem = build_problem(joint_graph, node_info, costs, fusion=self.request.compiler == "inductor",
                                policy=self.request.policy)
        if self.scope is not None:  # every memory row is the rank's
            problem = self.scope.applied(problem)
        elif self.unread_state:  # every memory row holds the module's unread state
            problem = replace(problem, outside_bytes=problem.outside_bytes + self.unread_state)
        return problem, costs

    def lowest_of(self, problem: Problem) -> Lowest:
        """The smallest-peak plan of ``problem``, solved on first call, once per equal problem."""
        if problem not in self.lowest_by_problem:
            self.lowest_by_problem[problem] = lowest_of(problem, self.request.solve)
            while len(self.lowest_by_problem) > 4:
                del self.lowest_by_problem[next(iter(self.lowest_by_problem))]
        return self.lowest_by_problem[problem]

    def make_plan(self, joint_graph: fx.Graph, node_info: adapter.NodeInfo, forward: set[str]) -> GraphPlan:
        """Profile, build the problem and solve; figures the plan does not need wait until read."""
        t0 = time.perf_counter()
        problem, costs = self.profiled(joint_graph, node_info)
        profile_seconds = time.perf_counter() - t0
        lowest = self.lowest_of(problem)
        min_cut = torch_min_cut(joint_graph, node_info)
        t0 = time.perf_counter()
        solution, store_all = solve(problem, self.request.solve, lowest, target=self.target,
                                    settle_for_lowest=self.settle_for_lowest,
                                    extra=lambda: min_cut_candidates(problem, min_cut))
        timings = {"profile": profile_seconds, "solve": time.perf_counter() - t0}
        random = {n.name for n in joint_graph.nodes if costs.get(n.name) and costs[n.name].kind == "random"}
        # the plan must fit the user's target; the fitting loop may have solved toward another
        plan = GraphPlan(problem, solution, store_all, self.request, self.request.solve.target, forward, random, lowest,
                         profile_seconds=profile_seconds, timings=timings)
        if self.target is not None:
            plan.notes.append(f"planned to {format_bytes(self.target)} so that the compiled program fits")
        plan.notes.extend(region_notes(joint_graph, forward, self.request.checkpoint_regions))
        self.defer_figures(plan, min_cut)
        return plan

    def plan_from_cache(self, cached: plan_cache.CachedPlan, forward: set[str], min_cut: MinCut | None) -> GraphPlan:
        """A GraphPlan from disk: the stored problem and decision, nothing profiled or solved
        (``min_cut`` None: no joint graph to ask torch's partitioner about)."""
        problem = cached.problem
        facts = {**cached.solution, "status": Status(cached.solution["status"]),
                 "notes": tuple(cached.solution["notes"])}
        solution = replace(evaluate(problem, cached.saved), **facts)
        plan = GraphPlan(problem, solution, store_all(problem), self.request, cached.target, forward,
                         set(cached.random), self.lowest_of(problem), notes=list(cached.notes), plan_cache="hit",
                         figures=dict(cached.figures), compiled_peak_bytes=cached.compiled_peak,
                         handoff_bytes=cached.handoff)
        if min_cut is None:
            plan.figures = {**NO_MIN_CUT, **plan.figures}
        self.defer_figures(plan, min_cut)
        return plan

    def loaded_plan(self, cached: plan_cache.CachedPlan, seconds: float) -> GraphPlan:
        """The plan of a program AOTAutograd's cache loaded whole: its report from the stored plan."""
        plan = self.plan_from_cache(cached, set(), None)
        plan.scope = self.scope
        plan.plan_cache = "program"
        plan.timings = {"cached program": seconds}
        plan.graphs = dict.fromkeys(("forward", "backward"))  # nothing more arrives for it: complete
        plan.notes.append("plan and program loaded from remat's plan cache and AOTAutograd's cache: nothing "
                          "traced, profiled, solved or compiled (torch's min-cut figures need the joint graph)")
        self.note_rank(plan)
        self.plans.append(plan)
        return plan

    def defer_figures(self, plan: GraphPlan, min_cut: MinCut | None) -> None:
        """The smallest feasible budget, torch's min-cut plan and the peers' rules in the model,
        computed when first read (those not already known, for a plan from the cache)."""
        known = set(plan.figures)
        if not set(MIN_FEASIBLE) <= known:
            defer_min_feasible(plan)
        if not set(MIN_CUT) <= known:
            plan.defer(Once(lambda: min_cut_figures(plan.problem, min_cut)), *MIN_CUT)
        if not set(PEER_RULES) <= known:
            plan.defer(Once(lambda: {"peer_rules": peer_rules(plan.problem)}), *PEER_RULES)

    def remember_compiled(self, plan: GraphPlan) -> None:
        """Store ``plan`` again with its compiled program's peak, once that program fitted."""
        if self.disk is not None and plan.plan_cache == "stored" and plan.cache_key is not None:
            self.disk.store(plan.cache_key, plan_cache.entry_of(plan))

    def on_graph(self, gm: fx.GraphModule, kind: str) -> None:
        """Called with each partitioned graph before it is compiled.

        With graph breaks every forward compiles before any backward, and the
        backwards come in reverse order: a backward is matched to the plan
        whose forward hands over the values it reads.
        """
        plan = owner_of(gm, kind, self.plans)
        if plan is None:
            if kind == "backward":
                # torch built a backward remat did not plan (it stopped calling remat's
                # chooser?): never compile torch's own plan silently under remat's name
                raise PlanError("a backward graph arrived that no remat plan owns: torch's partitioner "
                                "did not ask remat for this graph's saved values; please report this "
                                "with your torch version")
            return  # an inference graph: nothing was planned
        plan.graphs[kind] = gm
        if plan.unfolded and adapter.unfold(gm.graph, plan.unfolded):
            gm.recompile()
        if kind == "backward":
            check_realized(plan)
            plan.graphs = dict.fromkeys(plan.graphs)  # matched and checked: the modules are not kept alive


STEP_NOTE = "the budget bounds the step: counted "


def scope_note(scope: RankScope | None, world_size: int, budget_scope: str) -> str | None:
    """What a budget bounds for this graph, when that is not simply the graph's whole step."""
    if scope is not None and scope.process:
        eager = (f"{format_bytes(scope.eager_bytes)} reserved for the eager code after the graph (three times its "
                 "outputs that a backward reaches: a loss outside the model), measured on the first step and counted from "
                 "the next" if scope.eager_reserved else
                 f"{format_bytes(scope.eager_bytes)} of eager code after the graph (such as a loss computed outside "
                 "the model), measured on the first step")
        return f"{STEP_NOTE}{eager}"
    if scope is not None:
        return (f"the budget bounds the rank's step ({scope.wrapper}): counted {format_bytes(scope.resident_bytes)} "
                f"resident, {format_bytes(scope.comm_bytes)} of communication buffers and {scope.copies} other "
                "copies of this graph's kept activations and inputs"
                + (f", {format_bytes(scope.eager_bytes)} of eager head and loss" if scope.eager_bytes else
                   "; the eager head and loss are measured on the first step and counted from the next"))
    if world_size > 1:
        return ("the budget bounds this graph's own step (budget_scope=\"graph\"): memory the rank holds outside "
                "it (other graphs' kept activations, FSDP's unsharded parameters and buffers, shards, eager code) "
                "is not counted")
    return None


def region_notes(joint_graph: fx.Graph, forward: set[str], regions: str) -> list[str]:
    """What became of the ops the model wraps in ``torch.utils.checkpoint``, if it wraps any."""
    inside = sum(1 for n in joint_graph.nodes if n.name in forward and in_checkpoint_region(n))
    if not inside:
        return []
    if regions == "plan":
        return [f"{inside} ops inside torch.utils.checkpoint regions planned by remat like the rest "
                "(checkpoint_regions=\"plan\")"]
    return [f"{inside} ops inside torch.utils.checkpoint regions recomputed as the model asks "
            "(checkpoint_regions=\"plan\" lets remat decide)"]


def one_line(plan: GraphPlan) -> str:
    """A log line: the plan's peak, store-all's, and what it recomputes."""
    return (f"predicted peak {format_bytes(plan.solution.peak_bytes)} (store-all "
            f"{format_bytes(plan.store_all.peak_bytes)}), {len(plan.solution.recomputed)} values recomputed, "
            f"solver {plan.solution.solver} ({plan.solution.status.value})")


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


def check_realized(plan: GraphPlan) -> None:
    """The graphs torch built must do what the plan says (the self-check of docs/design.md)."""
    forward, backward = plan.graphs["forward"], plan.graphs["backward"]
    again = recomputed_in(backward, plan.forward_names)
    if again & plan.random_names:
        raise PlanError(f"random ops would be recomputed with fresh randomness: {sorted(again & plan.random_names)}")
    extra = again - plan.solution.recomputed
    if extra:
        plan.notes.append(f"backward recomputes {len(extra)} values the plan keeps or frees: {sorted(extra)[:5]}")
    peak = realized_peak(forward, backward)
    plan.realized_peak_bytes = peak
    predicted = plan.solution.peak_bytes
    # Unfused, the realized graphs must peak where the plan says; Inductor's
    # fusion makes the prediction lower than this op-by-op figure on purpose.
    if plan.request.compiler == "eager" and peak > predicted:
        plan.notes.append(f"realized graphs peak at {peak} bytes, above the predicted {predicted}")
        log.warning(plan.notes[-1])
        budget = plan.request.budget_bytes
        if budget is not None and peak > budget:  # op by op, this peak is the one the step will reach
            raise PlanError(f"the partitioned graphs would peak at {peak} bytes, over the budget of {budget}; "
                            f"please report this graph, and meanwhile pass headroom= to plan below the budget")
