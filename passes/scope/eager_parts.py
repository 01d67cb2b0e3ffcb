"""The eager parts of a step, measured on its first step and counted from the next.

Code that no compiled graph holds runs between a graph's forward and its backward: a loss computed
outside the model, graph-break code and the graphs after a break, a head left uncompiled, and under
FSDP2 per-block compiles the model's embedding, head and loss. Their memory is in no graph. So on the
first step each graph's compiled callable (:class:`EagerWatch`) measures that window
(``passes/scope/eager_window.py``): the peak allocated above what the graph's last forward call left, until
the gradient of its output arrives, what it leaves alive through the backward and what it freed; the
forward calls made before that backward (a block compiled once, called per layer); and the state of
other graphs that ran inside it. At the graph's next call (every rank, under torch.distributed, taking
the largest any measured) the step scope counts them (``RankScope``: ``Problem.handoff_bytes`` at the
graph's last forward step, the rest at every step): a plan that still fits keeps its program and its
figures are read again; one that does not is planned and compiled again, or the budget is refused with
the smallest budget that fits. The first step runs with a reservation
(``rank_scope.reserved_eager_bytes``) and the measured figures are remembered for the graph
(``step.STEP``); where the first step ran over the budget, a warning says so.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

import torch

from remat.solvers.errors import BudgetError, format_bytes
from remat.solvers.problem import Kind
from ..peaks import rank_peak_with, with_timeline
from .eager_window import (  # noqa: F401  (re-exported: the watch's vocabulary)
    DEFERRED,
    UNKNOWN,
    EagerParts,
    EagerWindow,
    measure_loss,
    peak_between_marks,
    window_of,
)
from ..decide.graph_plan import STEP_NOTE, defer_figures, scope_note
from .rank_scope import storages_of
from .ranks import largest_on_any_rank
from .step import STEP, OpenGraph

log = logging.getLogger(__name__)
# forward calls with no gradient arriving (a model run with grad on but no backward) after which the
# window closes unmeasured: on the CPU its profiler would otherwise record for ever
MAX_CALLS = 1024


class State(enum.Enum):
    MEASURING = "measuring"  # the first step: each forward call opens the window anew
    COUNTING = "counting"  # measured: counted at the next call, when every rank is there
    DONE = "done"


Replan = Callable[[Any, EagerParts], tuple[Callable[..., Any], Any]]


class EagerWatch:
    """A graph's compiled callable, which measures the eager window on the first step and
    counts it at the next call: where the plan still fits with it, ``recount(plan, eager)`` makes
    the plan that counts it (:func:`raised_by`), else ``replan(plan, eager)`` returns the callable
    and the plan of a plan that fits (or raises ``BudgetError``). Each new plan (a note added makes
    one) is handed to ``supersede(old, new)``, which puts it where the old one was read."""

    def __init__(self, compiled: Callable[..., Any], plan: Any, replan: Replan, recount: Callable[[Any, EagerParts], Any],
                 supersede: Callable[[Any, Any], None], state: dict[tuple, int] | None = None) -> None:
        self.compiled, self.plan, self.replan = compiled, plan, replan
        self.recount, self.supersede = recount, supersede
        self.model_state = state or {}  # the parameters and buffers this graph's plan counts, by storage
        self.others: dict[tuple, int] = {}  # state of other graphs that ran in the window
        self.window = EagerWindow()
        self.hooks: list[Any] = []
        self.measured = UNKNOWN
        self.state = State.MEASURING
        self.calls = 0
        self.calls_in_step = 1  # forward calls before the first backward, on the step that measured
        if getattr(compiled, "_boxed_call", False):  # called with one list, as the compiled callable is
            self._boxed_call = True

    def __del__(self) -> None:
        # a graph called once and freed (a one-step run): its CPU profiler stops with it
        try:
            STEP.close(self)
            self.window.cancel()
        except Exception:  # at interpreter exit torch may be half gone: nothing left to stop
            pass

    def __call__(self, *args: Any) -> Any:
        for other in STEP.open_watches():  # this graph runs inside their windows
            if other is not self:
                other.others.update(self.model_state)
        if self.state is State.COUNTING:
            self.state = State.DONE
            self.measured = self.window.close()
            self.count()
        inputs: dict[tuple, int] = {}
        if self.state is State.MEASURING:
            self.window.arm(_device_of(args))
            # read before the call: a boxed call empties its argument list
            inputs = {key: n for key, n in storages_of(_leaves(args)).items() if key not in self.model_state}
        try:
            out = self.compiled(*args)
        except BaseException:
            self.window.cancel()  # no window opens: its session must not outlive the call
            raise
        if self.state is State.MEASURING:
            self.calls += 1
            self.watch(out, inputs)
        return out

    def defer(self) -> None:
        """A profiler of the caller's ran through the window: measure it on the next step instead."""
        if not any("deferred" in note for note in self.plan.notes):
            log.info("remat: the eager parts of the step were not measured while your profiler ran; "
                     "remat measures them on the next step without one")
            self.revise(self.plan.noted("eager parts deferred: a profiler of the caller's was running on the step "
                                        "that would measure them; measured on the first step without one"))
        self.window = EagerWindow()
        self.state = State.MEASURING
        self.calls = 0

    def watch(self, out: Any, inputs: dict[tuple, int]) -> None:
        """A forward call returned: the window opens here, until its outputs' first gradient. ``inputs``:
        the call's activation inputs by storage (a batch the caller holds through the step)."""
        self.unhook()
        if self.calls > MAX_CALLS:  # no backward came: count nothing, at the next call
            self.window.cancel()
            self.state = State.COUNTING
            return
        tensors = [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not tensors:  # a call that no backward follows
            return
        self.window.open(tensors[0].device, sum(t.numel() * t.element_size() for t in tensors))
        self.hooks = [t.register_hook(self.gradient_arrived) for t in tensors]
        if self.plan.scope is not None and self.plan.scope.process:  # a graph compiled now runs beside it
            STEP.open(self, OpenGraph(held_after_forward(self.plan), self.model_state, storages_of(tensors), inputs))

    def gradient_arrived(self, grad: torch.Tensor) -> None:
        if self.hooks:  # the first of the outputs' gradients: the backward reaches this graph
            self.calls_in_step = self.calls
            self.window.end()
            self.unhook()
            self.state = State.COUNTING

    def unhook(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        STEP.close(self)

    def count(self) -> None:
        """Every rank at its next call: the largest window any measured, counted in the plan."""
        eager, after, calls, freed = largest_on_any_rank([self.measured, self.window.after, self.calls_in_step,
                                                          -self.window.freed])
        freed = -freed  # (the least any rank freed)
        if eager == DEFERRED:  # every rank's caller was profiling: the next step measures
            self.defer()
            return
        if self.window.bounded:
            self.revise(self.plan.noted("eager parts counted at most: their window did not raise the allocator's "
                                        "peak, so the peak before it bounds them"))
        if eager == UNKNOWN:
            log.warning("remat: the eager parts of the step (its head and loss) were not measured on the first "
                        "step (no backward followed its forward): the per-rank budget does not "
                        "count them")
            self.revise(self.plan.noted("eager parts not measured on the first step (no backward followed): "
                                        "not counted"))
            return
        budget, target = self.plan.request.budget_bytes, self.plan.target
        (others,) = largest_on_any_rank([sum(n for key, n in self.others.items() if key not in self.model_state)])
        parts = EagerParts(eager, after, calls - 1, others, freed)
        if target is None or budget is None:  # no budget: the report counts them
            self.revise(self.recount(self.plan, parts))
            return
        (peak,) = largest_on_any_rank([rank_peak_with(self.plan, parts)])
        if peak > budget:
            counted = self.plan.scope.eager_bytes if self.plan.scope is not None else 0
            log.warning("remat: the first step counted %s for the eager parts, which measured %s (between the last "
                        "forward and the first backward: the head and loss) and put the rank's predicted peak at %s, "
                        "over the budget %s; planning again with them", format_bytes(counted), format_bytes(eager),
                        format_bytes(peak), format_bytes(budget))
        if peak <= target:
            self.revise(self.recount(self.plan, parts))
            return
        try:
            self.compiled, plan = self.replan(self.plan, parts)
        except BudgetError as exc:
            raise BudgetError(f"with the eager parts of the step measured on the first step ({format_bytes(eager)} "
                              f"between the last forward and the first backward: the model's head and loss): {exc}",
                              budget_bytes=exc.budget_bytes, min_feasible_bytes=exc.min_feasible_bytes) from None
        self.revise(plan)

    def revise(self, plan: Any) -> None:
        """``plan`` replaces the watch's plan, here and where the reports read it."""
        if plan is not self.plan:
            self.supersede(self.plan, plan)
            self.plan = plan


def held_after_forward(plan: Any) -> int:
    """What the graph holds between its forward and its backward besides its inputs (which the step
    counts as the model's state and the batch): by its compiled program where it was read, else the
    values the plan keeps."""
    inputs = sum(v.bytes for v in plan.problem.values if v.kind is Kind.INPUT)
    if plan.program is not None:
        return max(0, plan.program.handoff_bytes - inputs)
    by_name = {v.name: v.bytes for v in plan.problem.values}
    return sum(by_name.get(name, 0) for name in plan.solution.saved)


def raised_by(plan: Any, eager: EagerParts, lowest_of: Callable[[Any], Any]) -> Any:
    """A plan that still fits with ``eager`` parts, counting them: its problem holds the window's peak at
    the forward's last step and what it leaves through the backward, and its peaks, the smallest-peak
    plan (``lowest_of(problem)``) and the figures computed when read follow from that problem."""
    scope = plan.scope.with_eager(eager)
    remember(scope)
    problem = scope.applied(plan.problem)
    notes = plan.notes
    if scope.process:  # the note on what the step counts says measured, not reserved
        notes = (scope_note(scope, plan.world_size, plan.request.budget_scope),
                 *(n for n in notes if not n.startswith(STEP_NOTE)))
    else:  # (a process's step note above says it already)
        notes = (*notes, f"counted {format_bytes(eager.peak)} of eager parts (the head and loss between the "
                         "last forward and the first backward), measured on the first step")
    compiled_peak = None if plan.compiled_peak_bytes is None else rank_peak_with(plan, eager)
    raised = plan.revised(problem=problem, scope=scope, notes=notes, compiled_peak_bytes=compiled_peak,
                          lowest=lowest_of(problem), solution=with_timeline(problem, plan.solution),
                          store_all=with_timeline(problem, plan.store_all))
    defer_figures(raised)
    return raised


def remember(scope: Any) -> None:
    """A measured window (a process's, or the one every rank agreed on), for the graph's next compile in
    this process: the largest measured after it (the window is the caller's code after the graph, which
    may differ from step to step)."""
    if scope is None or not scope.graph:
        return
    measured = EagerParts(scope.eager_bytes, scope.eager_after_bytes, scope.copies, scope.other_state_bytes,
                          scope.eager_freed_bytes)
    STEP.remember(scope.graph, measured)


def remember_measured(gm: Any, measured: EagerParts) -> None:
    """A window measured for the dynamo graph ``gm`` (``measure_loss``), for its scope to count."""
    from ..cache.plan_cache import graph_fingerprint

    STEP.remember(graph_fingerprint(gm.graph, by_position=True), measured)


def _device_of(args: tuple) -> torch.device:
    tensor = next((t for t in _leaves(args) if isinstance(t, torch.Tensor)), None)
    return torch.device("cpu") if tensor is None else tensor.device


def _leaves(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return [leaf for item in out for leaf in _leaves(item)]
    return [out]


def abandon_open_windows() -> None:
    """A graph of the step failed to compile: the windows of the graphs before it will see no backward,
    and their sessions stop now (the next step measures them)."""
    for watch in STEP.open_watches():
        watch.unhook()
        watch.window.cancel()
        watch.window = EagerWindow()
