"""The eager parts of a rank's step, measured on its first step (``budget_scope="rank"``).

Under FSDP2 with each block compiled (or DDP around a compiled model) code that no compiled
graph holds runs between the graphs: the model's embedding, its head and its loss. Their
memory is in no graph and in no FSDP state. The part that matters runs between the graph's
last forward call and its first backward: the head and the loss, forward and backward, while
every block holds its kept activations. So on the first step each rank measures that window:
the peak bytes allocated above what was allocated when the graph's last forward call returned,
until the gradient of its output arrives (CUDA: the caching allocator's statistics, read, never reset;
CPU: a profiler session of remat's own, only where the caller runs none: :class:`EagerWindow`). At the graph's next call the ranks take the
largest window any of them measured and the rank scope counts it (``RankScope.eager_bytes``,
``Problem.handoff_bytes``) at the graph's last forward step, where the graph holds what it hands
its backward (under Inductor: beside what the compiled forward returns). A plan that still fits
keeps its program, its figures read again with those bytes; one that does not is planned and
compiled again, or the budget is refused, on every rank, with the smallest budget that fits. The
first step itself ran with them uncounted: where that put it over the budget, a warning says so.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from remat.solvers.errors import BudgetError, format_bytes
from remat.solvers.simulate import timeline

from . import torch_adapter as adapter
from .fit import compiled_rank_peak
from .measure import peak_of_events
from .partition import MIN_FEASIBLE, defer_min_feasible
from .ranks import largest_on_any_rank

log = logging.getLogger(__name__)
UNKNOWN = -1  # a window not measured (no backward followed the forward)
DEFERRED = -2  # a window not measured because a profiler of the caller's was running: a later step measures
# forward calls with no gradient arriving (a model run with grad on but no backward) after which the
# window closes unmeasured: on the CPU its profiler would otherwise record for ever
MAX_CALLS = 1024


class EagerWindow:
    """Peak bytes allocated from the last :meth:`open` to :meth:`end`, above what was allocated at
    that :meth:`open`, read by :meth:`close` later; ``DEFERRED`` where it could not be measured
    without disturbing a profiler of the caller's.

    CUDA: the caching allocator's statistics, read, never reset (a caller reading
    ``max_memory_allocated`` around the step reads what it would without remat): exact where the
    window raised the allocator's peak, else the peak before the window (a bound, and ``bounded``).
    CPU: one profiler session of remat's own from the first :meth:`open`, marked at each :meth:`open`
    and at :meth:`end`, opened only when no profiler of the caller's runs, and stopped as the backward
    that reached :meth:`end` returns (stopped inside the backward, autograd would enable it again when
    the backward ends, and the caller's next profiler would be refused)."""

    OPEN, END = "remat::eager_window_open", "remat::eager_window_end"

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.start = self.prior_peak = 0
        self.peak = UNKNOWN
        self.bounded = False
        self.session: adapter.OwnSession | None = None
        self.deferred = False  # the caller was profiling as it opened: measure on a later step

    def open(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.start = torch.cuda.memory_allocated(device)
            self.prior_peak = torch.cuda.max_memory_allocated(device)
            return
        if self.session is None and not self.deferred:
            session = adapter.OwnSession()
            try:
                session.start()
                self.session = session
            except adapter.ProfilerBusy:
                self.deferred = True
        if self.session is not None:
            adapter.profiler_mark(self.OPEN)

    def end(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            self.bounded = peak <= self.prior_peak  # the window's own peak is not above an earlier one
            self.peak = max(0, peak - self.start)
        elif self.session is not None:
            adapter.profiler_mark(self.END)
            if not adapter.when_backward_returns(self.stop):
                self.stop()  # no backward entry point to wait for (a backward started from C++)

    def stop(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            self.peak = peak_between_marks(session.stop(), self.OPEN, self.END)

    def close(self) -> int:
        """The window's peak (``DEFERRED`` or ``UNKNOWN`` where not measured); call it outside any backward."""
        self.device = None
        self.cancel()
        return DEFERRED if self.deferred else self.peak

    def cancel(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None
        self.device = None


def peak_between_marks(trace: list[dict[str, Any]], opened: str, ended: str) -> int:
    """Peak bytes allocated from the last ``opened`` mark before the first ``ended`` mark of a
    profiler trace up to it, above the running total at ``opened``; UNKNOWN without both marks."""
    ends = [e["ts"] for e in trace if e.get("name") == ended]
    opens = [e["ts"] for e in trace if e.get("name") == opened and ends and e["ts"] <= ends[0]]
    if not opens:
        return UNKNOWN
    cpu = torch.device("cpu")
    memory = sorted((e for e in trace if e.get("name") == "[memory]" and adapter.on_device(e["args"], cpu)),
                    key=lambda e: e["ts"])
    # a running total: the window's first event says where the window started
    return peak_of_events([e["args"] for e in memory if opens[-1] <= e["ts"] <= ends[0]])


class State(enum.Enum):
    MEASURING = "measuring"  # the first step: each forward call opens the window anew
    COUNTING = "counting"  # measured: counted at the next call, when every rank is there
    DONE = "done"


class EagerWatch:
    """A graph's compiled callable, which measures the eager window on the first step and
    counts it at the next call: ``recount(eager)`` when the plan still fits with it (it raises
    the plan's figures), else ``replan(eager)``, which returns the callable of a plan that fits
    (or raises ``BudgetError``)."""

    def __init__(self, compiled: Callable[..., Any], plan: Any, replan: Callable[[int], Callable[..., Any]],
                 recount: Callable[[int], None]) -> None:
        self.compiled, self.plan, self.replan, self.recount = compiled, plan, replan, recount
        self.window = EagerWindow()
        self.hooks: list[Any] = []
        self.measured = UNKNOWN
        self.state = State.MEASURING
        self.calls = 0
        if getattr(compiled, "_boxed_call", False):  # called with one list, as the compiled callable is
            self._boxed_call = True

    def __del__(self) -> None:
        # a graph called once and freed (a one-step run): its CPU profiler stops with it
        try:
            self.window.cancel()
        except Exception:  # at interpreter exit torch may be half gone: nothing left to stop
            pass

    def __call__(self, *args: Any) -> Any:
        if self.state is State.COUNTING:
            self.state = State.DONE
            self.measured = self.window.close()
            self.count()
        out = self.compiled(*args)
        if self.state is State.MEASURING:
            self.calls += 1
            self.watch(out)
        return out

    def defer(self) -> None:
        """A profiler of the caller's ran through the window: measure it on the next step instead."""
        if not any("deferred" in note for note in self.plan.notes):
            log.info("remat: the eager parts of the step were not measured while your profiler ran; "
                     "remat measures them on the next step without one")
            self.plan.notes.append("eager parts deferred: a profiler of the caller's was running on the step "
                                   "that would measure them; measured on the first step without one")
        self.window = EagerWindow()
        self.state = State.MEASURING
        self.calls = 0

    def watch(self, out: Any) -> None:
        """A forward call returned: the window opens here, until its outputs' first gradient."""
        self.unhook()
        if self.calls > MAX_CALLS:  # no backward came: count nothing, at the next call
            self.window.cancel()
            self.state = State.COUNTING
            return
        tensors = [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not tensors:  # a call that no backward follows
            return
        self.window.open(tensors[0].device)
        self.hooks = [t.register_hook(self.gradient_arrived) for t in tensors]

    def gradient_arrived(self, grad: torch.Tensor) -> None:
        if self.hooks:  # the first of the outputs' gradients: the backward reaches this graph
            self.window.end()
            self.unhook()
            self.state = State.COUNTING

    def unhook(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def count(self) -> None:
        """Every rank at its next call: the largest window any measured, counted in the plan."""
        (eager,) = largest_on_any_rank([self.measured])
        if eager == DEFERRED:  # every rank's caller was profiling: the next step measures
            self.defer()
            return
        if self.window.bounded:
            self.plan.notes.append("eager parts counted at most: their window did not raise the allocator's peak, "
                                   "so the peak before it bounds them")
        if eager == UNKNOWN:
            log.warning("remat: the eager parts of the step (its head and loss) were not measured on the first "
                        "step (no backward followed its forward): the per-rank budget does not "
                        "count them")
            self.plan.notes.append("eager parts not measured on the first step (no "
                                   "backward followed): not counted")
            return
        budget, target = self.plan.request.budget_bytes, self.plan.target
        if target is None or budget is None:  # no budget: the report counts them
            self.recount(eager)
            return
        (peak,) = largest_on_any_rank([rank_peak_with(self.plan, eager)])
        if peak > budget:
            log.warning("remat: the first step ran with the eager parts uncounted (%s between the last forward "
                        "and the first backward: the head and loss), which put the rank's predicted peak at %s, "
                        "over the budget %s; planning again with them", format_bytes(eager),
                        format_bytes(peak), format_bytes(budget))
        if peak <= target:
            self.recount(eager)
            return
        try:
            self.compiled = self.replan(eager)
        except BudgetError as exc:
            raise BudgetError(f"with the eager parts of the step measured on the first step ({format_bytes(eager)} "
                              f"between the last forward and the first backward: the model's head and loss): {exc}",
                              budget_bytes=exc.budget_bytes, min_feasible_bytes=exc.min_feasible_bytes) from None


def rank_peak_with(plan: Any, eager: int) -> int:
    """The rank's peak under ``plan`` with ``eager`` bytes of eager code between the graph's forward
    and its backward: by its compiled program where there is one (Inductor), else by the model."""
    if plan.compiled_peak_bytes is None:
        problem = replace(plan.problem, handoff_bytes=eager)
        return max(timeline(problem, plan.solution.saved, plan.solution.recomputed), default=0)
    if plan.handoff_bytes is None:  # a program whose forward's end was not read: as if at its peak
        return plan.compiled_peak_bytes + eager
    # the program's peak stands as accepted; the hand-off with the eager bytes may now be higher
    return max(plan.compiled_peak_bytes, compiled_rank_peak(plan, 0, eager))


def raised_by(plan: Any, eager: int, lowest_of: Callable[[Any], Any]) -> None:
    """Count ``eager`` bytes in a plan that still fits with them: its problem holds them at the
    forward's last step, and its peaks, the smallest-peak plan (``lowest_of(problem)``) and the
    smallest feasible budget are read again from it."""
    if plan.compiled_peak_bytes is not None:
        plan.compiled_peak_bytes = rank_peak_with(plan, eager)
    plan.scope = replace(plan.scope, eager_bytes=eager)
    plan.problem = plan.scope.applied(plan.problem)
    plan.lowest = lowest_of(plan.problem)
    plan.solution = with_timeline(plan.problem, plan.solution)
    plan.store_all = with_timeline(plan.problem, plan.store_all)
    for name in MIN_FEASIBLE:
        plan.figures.pop(name, None)
    defer_min_feasible(plan)
    plan.notes.append(f"counted {format_bytes(eager)} of eager parts (the head and loss between the last forward "
                      "and the first backward), measured on the first step")


def with_timeline(problem: Any, solution: Any) -> Any:
    line = timeline(problem, solution.saved, solution.recomputed)
    return replace(solution, peak_bytes=max(line, default=0), timeline=line)


def _leaves(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return [leaf for item in out for leaf in _leaves(item)]
    return [out]
