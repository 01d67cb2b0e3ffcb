"""One compile of one captured graph: what it asks the planner for, and the plan it got.

torch's partitioner asks for a joint graph's saved values from deep inside ``torch.compile``; remat
answers through a hook installed for the length of one compile (``adapter.saved_values_chooser``).
Each compile gets an :class:`Attempt` of its own: the hook it installs is the planner's chooser
bound to that attempt, and the graphs torch partitions for it are checked against that attempt's
plan. So whatever the fitting loop (``passes/program/fit.py``), the program cache or the backend compile,
the plan of a compile is ``attempt.plan``, and nothing about one compile is left on the planner
for the next.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch.fx as fx

from remat.solvers.errors import PlanError

from .. import torch_adapter as adapter
from .graph_plan import GraphPlan
from ..modeling.memory import realized_peak, recomputed_in
from ..scope.rank_scope import RankScope

log = logging.getLogger(__name__)
Compile = Callable[..., Callable[..., Any]]


class Chooser(Protocol):
    """What answers torch's partitioner for an attempt: ``passes/decide/partition.py``'s ``Planner``."""

    def choose(self, attempt: Attempt, joint_graph: fx.Graph, node_info: Any) -> list[fx.Node]: ...


class CompileStopped(Exception):
    """The one exception remat raises through torch's stack: torch's partitioner has no way to end
    a compile early, and remat stops some at the partitioner (``Attempt.stop``: why is
    ``attempt.stopped``). "planned": ``remat.plan`` op by op needs the plan, not the program;
    "program miss": a program that was to load whole from AOTAutograd's cache was not there;
    "unwanted": the fitting loop turns the plan down (``Attempt.wanted``), and Inductor would
    compile it for nothing."""

    def __init__(self, why: str) -> None:
        super().__init__(f"remat stopped the compile at the partitioner: {why}")
        self.why = why
        self.plan: GraphPlan | None = None  # the graph's plan, where one was made and is kept

    def with_plan(self, plan: GraphPlan | None) -> CompileStopped:
        self.plan = plan
        return self


@dataclass(frozen=True)
class GraphSetting:
    """What the backend knows of one captured graph before planning it, the same for each of its
    compiles."""

    scope: RankScope | None = None  # the rank's (or the process's step's) memory outside the graph
    # bytes of the compiled module's parameters and buffers the graph does not read (held all the same)
    unread_state: int = 0
    input_names: dict = field(default_factory=dict)  # the graph's inputs by the user's names (passes/capture/names.py)
    # under torch.distributed, on ranks other than 0: rank 0's plan record and its joint graph's node names
    given: tuple[dict, list[str]] | None = None
    record_programs: bool = False  # record AOTAutograd's cache entry of each program (passes/cache/program_cache.py)
    # what its programs follow from besides the plan (passes/known_programs.identity), read once where
    # the backend compiles with Inductor, before remat's own Inductor settings; "" elsewhere
    program: str = ""


@dataclass(eq=False)
class Attempt:
    """One compile of a graph. What it asks for (the fields set when it is made), then what it got:
    ``plan`` (None for an inference graph: torch asked for no saved values) and when it was chosen."""

    setting: GraphSetting
    target: int | None = None  # the peak the plan is solved to fit (None: the request's own)
    settle_for_lowest: bool = False  # a target below the model's smallest peak yields the smallest-peak plan
    storing: bool = True  # a plan made may be written to the plan cache (off for plans made only to measure)
    # whether a plan just made is to be compiled; if not, the compile stops at the partitioner ("unwanted")
    wanted: Callable[[GraphPlan], bool] | None = None
    replay: GraphPlan | None = None  # a plan made already, handed out again (its graph compiled once more)
    expect_program: bool = False  # the program is to load whole: reaching the partitioner is a miss
    stop_after_plan: bool = False  # remat.plan op by op: stop the compile once the graph is planned
    capture_started: float = field(default_factory=time.perf_counter)
    plan: GraphPlan | None = None
    chosen_at: float = 0.0  # when the saved set was handed to torch
    stopped: str = ""  # why the compile was stopped at the partitioner (CompileStopped), if it was
    # the partitioned graphs torch built for this compile, by kind, until the backward's arrival checks them
    graphs: dict[str, fx.GraphModule | None] = field(default_factory=dict)

    def stop(self, why: str) -> CompileStopped:
        """End this compile at the partitioner, for ``why`` (raise what this returns)."""
        self.stopped = why
        return CompileStopped(why)

    def on_graph(self, gm: fx.GraphModule, kind: str) -> None:
        """Called with each partitioned graph of this compile before it is compiled (a backward
        may come later, at its first call)."""
        plan = self.plan
        if plan is None:
            if kind == "backward":
                # torch built a backward remat did not plan (it stopped calling remat's
                # chooser?): never compile torch's own plan silently under remat's name
                raise PlanError("a backward graph arrived that no remat plan owns: torch's partitioner "
                                "did not ask remat for this graph's saved values; please report this "
                                "with your torch version")
            return  # an inference graph: nothing was planned
        self.graphs[kind] = gm
        if plan.unfolded and adapter.unfold(gm.graph, plan.unfolded):
            gm.recompile()
        if kind == "backward":
            plan.realized.fill(*check_realized(plan, self.graphs["forward"], gm))
            self.graphs = dict.fromkeys(self.graphs)  # matched and checked: the modules are not kept alive


@contextlib.contextmanager
def choosing(planner: Chooser, attempt: Attempt) -> Iterator[None]:
    """torch's partitioner asks ``planner`` for the saved values, on behalf of ``attempt``, in the block."""
    with adapter.saved_values_chooser(lambda graph, info: planner.choose(attempt, graph, info)):
        yield


def compile_attempt(gm: fx.GraphModule, example_inputs: Any, planner: Chooser, attempt: Attempt,
                    compile_graph: Compile, *, within: contextlib.AbstractContextManager | None = None,
                    **options: Any) -> Callable[..., Any]:
    """Compile ``gm`` once for ``attempt`` (``within``: a context entered inside the chooser's, such
    as AOTAutograd's cache keyed on a plan); its plan is ``attempt.plan`` afterwards."""
    with choosing(planner, attempt), (within or contextlib.nullcontext()):
        return compile_graph(gm, example_inputs, on_graph=attempt.on_graph, **options)


def check_realized(plan: GraphPlan, forward: fx.GraphModule, backward: fx.GraphModule) -> tuple[int, tuple[str, ...]]:
    """The graphs torch built must do what the plan says (the self-check of docs/design.md): what
    they peak at op by op, and what the check noticed."""
    again = recomputed_in(backward, plan.forward_names)
    if again & plan.random_names:
        raise PlanError(f"random ops would be recomputed with fresh randomness: {sorted(again & plan.random_names)}")
    notes = []
    extra = again - plan.solution.recomputed
    if extra:
        notes.append(f"backward recomputes {len(extra)} values the plan keeps or frees: {sorted(extra)[:5]}")
    peak = realized_peak(forward, backward)
    predicted = plan.solution.peak_bytes
    # Unfused, the realized graphs must peak where the plan says; Inductor's
    # fusion makes the prediction lower than this op-by-op figure on purpose.
    if plan.request.compiler == "eager" and peak > predicted:
        notes.append(f"realized graphs peak at {peak} bytes, above the predicted {predicted}")
        log.warning(notes[-1])
        budget = plan.request.budget_bytes
        if budget is not None and peak > budget:  # op by op, this peak is the one the step will reach
            raise PlanError(f"the partitioned graphs would peak at {peak} bytes, over the budget of {budget}; "
                            f"please report this graph, and meanwhile pass headroom= to plan below the budget")
    return peak, tuple(notes)
