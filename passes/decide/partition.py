"""Partition pass: decide the saved set of each joint graph, and check the result.

:class:`Planner` is what torch's partitioner calls (through
``torch_adapter.saved_values_chooser``, installed for one compile by
``passes/decide/attempt.py``) for each joint graph: it profiles the graph, builds the
:class:`Problem`, solves it under the budget and hands back the nodes to save. torch
then builds the forward and backward graphs, recomputing in the backward every forward
value it needs and was not handed, just before its first use. When those graphs arrive
for compilation they are checked against the plan (``attempt.check_realized``).

The planner holds what every compile of a model shares (the request, the plan cache, the
timing cache, smallest-peak plans and compiled programs' peaks by decision); what one compile
asks for and gets is its :class:`~.attempt.Attempt`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch.fx as fx

from remat.solvers.baselines import store_all
from remat.solvers.errors import format_bytes
from remat.solvers.plan import Lowest, lowest_of, solve
from remat.solvers.problem import Problem
from remat.solvers.simulate import evaluate
from remat.solvers.solution import Solution, Status

from ..cache import plan_cache

from ..scope import ranks
from .. import torch_adapter as adapter
from .attempt import Attempt, GraphSetting
from ..scope.rank_scope import RankScope
from ..program.known_programs import ProgramAccount
from .graph_plan import (FIGURES, NO_MIN_CUT, GraphPlan, MinCut, Realized, defer_figures, min_cut_candidates,
                         one_line, scope_note, torch_min_cut)
from ..capture.names import names_of
from ..modeling.policies import in_checkpoint_region
from ..modeling.problem import build_problem, unfolded_adds
from ..costs.profile import SHARED_TIMINGS, profile_graph
from .request import PlanRequest

log = logging.getLogger(__name__)

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
    """What every compile of one model shares: the request, the plan cache, measured op costs,
    smallest-peak plans by problem (compiled programs' peaks are the process's:
    ``passes/program/known_programs.py``). Each compile asks it for a plan through its own :class:`Attempt` (``choose``)."""

    def __init__(self, request: PlanRequest) -> None:
        self.request = request
        # one cache per process: planning and compiling the same model then
        # see the same costs (CPU workspace, in particular, varies run to run)
        self.cache = SHARED_TIMINGS
        # The fitting loop plans one graph several times, each from an equal problem:
        # its smallest-peak plan is solved once (a few graphs' worth: graph breaks).
        self.lowest_by_problem: dict[Problem, Lowest] = {}
        folder = request.plan_cache
        self.disk = plan_cache.PlanCache(folder) if folder is not None else None

    def choose(self, attempt: Attempt, joint_graph: fx.Graph, node_info: adapter.NodeInfo) -> list[fx.Node]:
        """The nodes ``joint_graph``'s forward hands its backward, for ``attempt`` (its plan is then
        ``attempt.plan``)."""
        if attempt.expect_program:
            raise attempt.stop("program miss")
        entered = time.perf_counter()
        setting = attempt.setting
        # A plan holds for the sizes it was made at: under a budget, dynamic
        # sizes are pinned (guarded), so another size compiles and plans anew.
        specialized = self.request.budget_bytes is not None and adapter.specialize_sizes(joint_graph)
        forward = {n.name for n in joint_graph.nodes if node_info.is_required_fw(n)}
        if attempt.replay is not None:  # the same graph compiled again (passes/program/fit.py): the same plan
            plan = attempt.replay.revised(realized=Realized())  # (its graphs are checked anew)
        elif setting.given is not None:
            plan = self.plan_given(setting.given, joint_graph, node_info, forward)
        else:
            # (judged with the memory around the graph)
            plan = self.local_plan(attempt, joint_graph, node_info, forward, specialized).revised(scope=setting.scope)
            if attempt.wanted is not None and not attempt.wanted(plan):
                attempt.plan = plan
                raise attempt.stop("unwanted")
        attempt.plan = plan = self.in_graph(plan, setting, joint_graph, node_info, entered - attempt.capture_started)
        log.info("remat plan: %s", one_line(plan))
        attempt.chosen_at = time.perf_counter()
        if attempt.stop_after_plan:
            raise attempt.stop("planned")
        return nodes_to_save(joint_graph, node_info, plan.solution)

    def in_graph(self, plan: GraphPlan, setting: GraphSetting, joint_graph: fx.Graph, node_info: adapter.NodeInfo,
                 capture_seconds: float) -> GraphPlan:
        """``plan`` as this graph and its setting see it: the graph's node names and the user's names for
        them (read from this graph: a cached plan's may differ), the adds kept apart from their matmul
        (passes/modeling/problem.py), the memory around it, the rank, and the capture's seconds."""
        unfolded = unfolded_adds(joint_graph, node_info) if self.request.compiler == "inductor" else plan.unfolded
        plan = plan.revised(node_order=tuple(n.name for n in joint_graph.nodes), unfolded=unfolded,
                            names=names_of(joint_graph, setting.input_names), scope=setting.scope,
                            timings={"capture": capture_seconds, **plan.timings})
        plan = self.note_rank(plan)
        # (in a process's step scope they are its resident bytes)
        scope = plan.scope
        unread = setting.unread_state or (scope.resident_bytes if scope is not None and scope.process else 0)
        if unread:
            plan = plan.noted(f"counted {format_bytes(unread)} of the module's parameters and buffers that "
                              "this graph does not read (held through its step)")
        return plan

    def plan_given(self, given: tuple[dict, list[str]], joint_graph: fx.Graph, node_info: adapter.NodeInfo,
                   forward: set[str]) -> GraphPlan:
        """The plan rank 0 compiled for this graph (``passes/scope/ranks.py``), nothing profiled or solved."""
        record, names = given
        cached = plan_cache.plan_of_record(ranks.in_own_names(record, names, joint_graph))
        return self.plan_from_cache(
            cached, forward, torch_min_cut(joint_graph, node_info), plan_cache="rank 0",
            notes=(f"saved set decided by rank 0 of {ranks.world()[1]} and sent to every rank",))

    def note_rank(self, plan: GraphPlan) -> GraphPlan:
        """``plan`` with this process's rank, and what its budget bounds where that needs saying."""
        rank, world_size = ranks.world()
        plan = plan.revised(rank=rank, world_size=world_size)
        if self.request.budget_bytes is None:
            return plan
        note = scope_note(plan.scope, world_size, self.request.budget_scope)
        if note is not None and plan.scope is None:
            ranks.warn_once(note)
        return plan if note is None else plan.noted(note)

    def local_plan(self, attempt: Attempt, joint_graph: fx.Graph, node_info: adapter.NodeInfo, forward: set[str],
                   specialized: bool) -> GraphPlan:
        """The plan from the plan cache, or profiled and solved here (and stored)."""
        key = cached = None
        setting = attempt.setting
        if self.disk is not None:
            # the fitting loop's last plan is stored under the default key: the next
            # process starts from the plan that fitted
            key = plan_cache.graph_key(joint_graph, self.request, plan_cache.graph_device(joint_graph))
            if setting.scope is not None:  # planned for the rank: another rank layout is another plan
                key["rank_scope"] = setting.scope.key()
            if setting.unread_state:  # planned with other memory held: another plan
                key["unread_state_bytes"] = setting.unread_state
            cached = self.disk.load(key, joint_graph) if attempt.target is None else None
        if cached is not None:
            return self.plan_from_cache(cached, forward, torch_min_cut(joint_graph, node_info))
        plan = self.make_plan(attempt, joint_graph, node_info, forward)
        if specialized:
            plan = plan.noted("dynamic sizes pinned: each new size is planned under the budget again")
        if key is not None and attempt.storing:  # the plan cache is on
            stored = self.disk.store(key, plan_cache.entry_of(plan))
            plan = plan.revised(plan_cache="stored" if stored else "", cache_key=key)
        return plan

    def profiled(self, setting: GraphSetting, joint_graph: fx.Graph,
                 node_info: adapter.NodeInfo) -> tuple[Problem, dict]:
        """The graph's problem, and the costs profiled for it."""
        costs = profile_graph(joint_graph, mode=self.request.profile, cache=self.cache,
                              cost_folder=self.request.cost_cache, inductor=self.request.compiler == "inductor")
        problem = build_problem(joint_graph, node_info, costs, fusion=self.request.compiler == "inductor",
                                policy=self.request.policy)
        if setting.scope is not None:  # every memory row is the rank's
            problem = setting.scope.applied(problem)
        elif setting.unread_state:  # every memory row holds the module's unread state
            problem = replace(problem, outside=(*problem.outside,
                                                ("the module's state the graph does not read", setting.unread_state)))
        return problem, costs

    def lowest_of(self, problem: Problem) -> Lowest:
        """The smallest-peak plan of ``problem``, solved on first call, once per equal problem."""
        if problem not in self.lowest_by_problem:
            self.lowest_by_problem[problem] = lowest_of(problem, self.request.solve)
            while len(self.lowest_by_problem) > 4:
                del self.lowest_by_problem[next(iter(self.lowest_by_problem))]
        return self.lowest_by_problem[problem]

    def make_plan(self, attempt: Attempt, joint_graph: fx.Graph, node_info: adapter.NodeInfo,
                  forward: set[str]) -> GraphPlan:
        """Profile, build the problem and solve; figures the plan does not need wait until read."""
        t0 = time.perf_counter()
        problem, costs = self.profiled(attempt.setting, joint_graph, node_info)
        profile_seconds = time.perf_counter() - t0
        lowest = self.lowest_of(problem)
        min_cut = torch_min_cut(joint_graph, node_info)
        t0 = time.perf_counter()
        solution, store_all = solve(problem, self.request.solve, lowest, target=attempt.target,
                                    settle_for_lowest=attempt.settle_for_lowest,
                                    extra=lambda: min_cut_candidates(problem, min_cut))
        timings = {"profile": profile_seconds, "solve": time.perf_counter() - t0}
        random = frozenset(n.name for n in joint_graph.nodes if costs.get(n.name) and costs[n.name].kind == "random")
        notes = [] if attempt.target is None else [f"planned to {format_bytes(attempt.target)} so that the compiled "
                                                   "program fits"]
        # the plan must fit the user's target; the fitting loop may have solved toward another
        plan = GraphPlan(problem, solution, store_all, self.request, self.request.solve.target, frozenset(forward),
                         random, lowest, min_cut, profile_seconds=profile_seconds, timings=timings,
                         notes=(*notes, *region_notes(joint_graph, forward, self.request.checkpoint_regions)))
        defer_figures(plan)
        return plan

    def plan_from_cache(self, cached: plan_cache.CachedPlan, forward: set[str], min_cut: MinCut | None,
                        *, notes: tuple[str, ...] = (), **fields: object) -> GraphPlan:
        """A GraphPlan from disk: the stored problem and decision, nothing profiled or solved
        (``min_cut`` None: no joint graph to ask torch's partitioner about); ``notes`` and ``fields``
        added to what was stored."""
        problem = cached.problem
        facts = {**cached.solution, "status": Status(cached.solution["status"]),
                 "notes": tuple(cached.solution["notes"])}
        solution = replace(evaluate(problem, cached.saved), **facts)
        figures = {name: value for name, value in cached.figures.items() if name in FIGURES}
        if min_cut is None:
            figures = {**NO_MIN_CUT, **figures}
        stored = {"plan_cache": "hit", "compiled_peak_bytes": cached.compiled_peak,
                  "program": None if cached.handoff is None else ProgramAccount(None, cached.handoff, None)}
        plan = GraphPlan(problem, solution, store_all(problem), self.request, cached.target, frozenset(forward),
                         frozenset(cached.random), self.lowest_of(problem), min_cut, notes=(*cached.notes, *notes),
                         **{**stored, **figures, **fields})
        defer_figures(plan, known=set(figures))
        return plan

    def loaded_plan(self, cached: plan_cache.CachedPlan, seconds: float, scope: RankScope | None) -> GraphPlan:
        """The plan of a program AOTAutograd's cache loaded whole: its report from the stored plan."""
        plan = self.plan_from_cache(
            cached, set(), None, scope=scope, plan_cache="program", timings={"cached program": seconds},
            realized=Realized(done=True),  # nothing more arrives for it: complete
            notes=("plan and program loaded from remat's plan cache and AOTAutograd's cache: nothing traced, "
                   "profiled, solved or compiled (torch's min-cut figures need the joint graph)",))
        return self.note_rank(plan)

    def remember_compiled(self, plan: GraphPlan) -> None:
        """Store ``plan`` again with its compiled program's peak, once that program fitted."""
        if self.disk is not None and plan.plan_cache == "stored" and plan.cache_key is not None:
            self.disk.store(plan.cache_key, plan_cache.entry_of(plan))


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
