"""Measuring the eager code between a graph's forward and its backward, on the step that runs it.

:class:`EagerWindow` measures one window (the peak it allocates above where it opened, what it leaves
alive and what it frees), :func:`measure_loss` runs a loss alone as such a window (``remat.plan(...,
loss_fn=)``), and :class:`EagerParts` is what either measured. ``passes/scope/eager_parts.py`` counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import torch_adapter as adapter
from ..program.measure import peak_of_events

UNKNOWN = -1  # a window not measured (no backward followed the forward)
DEFERRED = -2  # a window not measured because a profiler of the caller's was running: a later step measures


@dataclass(frozen=True)
class EagerParts:
    """A measured window: its ``peak`` above what the graph's forward left, and what it leaves alive
    through the backward ``after`` it, besides the outputs' gradients."""

    peak: int
    after: int = 0
    copies: int | None = None  # forward calls of the graph before its first backward, less one (None: unknown)
    other_state: int = 0  # parameters and buffers of other graphs run in the window, not the graph's module's
    freed: int = 0  # what the window freed of what was there when it opened (outputs the caller dropped)


class EagerWindow:
    """Peak bytes allocated from the last :meth:`open` to :meth:`end`, above what was allocated at
    that :meth:`open`, read by :meth:`close` later; ``DEFERRED`` where a later step must measure it:
    a profiler of the caller's ran (remat starts none beside it), or a graph was compiled inside the
    window (the compile's own allocations are not the step's).

    CUDA: the caching allocator's statistics, read, never reset (a caller reading
    ``max_memory_allocated`` around the step reads what it would without remat): exact where the
    window raised the allocator's peak, else the peak before the window (a bound, and ``bounded``).
    CPU: one profiler session of remat's own from the first :meth:`arm` (before the graph's forward
    call, so that the frees of what the forward allocated are seen), marked at each :meth:`open` and at
    :meth:`end`, and stopped as the backward that reached :meth:`end` returns (stopped inside
    the backward, autograd would enable it again when the backward ends, and the caller's next profiler
    would be refused). Inside a step that ``remat.measure`` measures it rides on that session."""

    OPEN, END = "remat::eager_window_open", "remat::eager_window_end"

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.start = self.prior_peak = self.compiled_at_open = 0
        self.peak = UNKNOWN
        self.bounded = False
        self.session: adapter.OwnSession | None = None
        self.deferred = False  # measure on a later step
        self.ended = False
        self.tangent_bytes = 0  # the gradients the window ends with, which the graph's backward counts
        self.after = 0  # what the window leaves alive as it ends, besides those gradients
        self.freed = 0  # what it freed of what was allocated when it opened

    def arm(self, device: torch.device) -> None:
        """Before a forward call of the graph: on the CPU, the session starts (once)."""
        if device.type == "cpu" and self.session is None and not self.deferred and not self.ended:
            session = adapter.OwnSession()
            try:
                session.start()
                self.session = session
            except adapter.ProfilerBusy:
                self.deferred = True

    def open(self, device: torch.device, tangent_bytes: int = 0) -> None:
        """The forward call returned (with outputs whose gradients take ``tangent_bytes``): the window
        starts here."""
        self.device, self.tangent_bytes = device, tangent_bytes
        self.compiled_at_open = adapter.graphs_compiled()
        if device.type == "cuda":
            self.start = torch.cuda.memory_allocated(device)
            self.prior_peak = torch.cuda.max_memory_allocated(device)
        elif self.session is not None:
            adapter.profiler_mark(self.OPEN)

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.deferred |= adapter.graphs_compiled() != self.compiled_at_open
        if self.device is not None and self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            self.bounded = peak <= self.prior_peak  # the window's own peak is not above an earlier one
            self.peak = max(0, peak - self.start)
            self.settle(torch.cuda.memory_allocated(self.device) - self.start)
        elif self.session is not None:
            adapter.profiler_mark(self.END)
            if not adapter.when_backward_returns(self.session.stop):
                self.session.stop()  # no backward entry point to wait for (a backward started from C++)

    def settle(self, level: int) -> None:
        """``level``: the bytes allocated as the window ended, above where it opened."""
        self.after = max(0, level - self.tangent_bytes)
        self.freed = max(0, self.tangent_bytes - level)

    def close(self) -> int:
        """The window's peak (``DEFERRED``, or ``UNKNOWN`` where no backward came); call it outside any
        backward, on the thread that opened it."""
        self.device = None
        if self.session is not None:
            self.session.stop()  # (stopped already where a backward came)
            events, self.session = self.session.events, None
            if events is None:  # riding on a measurement of the caller's step that is still running
                return DEFERRED
            self.peak, level = window_of(events, self.OPEN, self.END)
            self.settle(level)
        return DEFERRED if self.deferred else self.peak

    def cancel(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None
        self.device = None


def peak_between_marks(trace: list[dict[str, Any]], opened: str, ended: str) -> int:
    """Peak bytes allocated from the last ``opened`` mark before the first ``ended`` mark of a
    profiler trace up to it, above the running total at ``opened``; UNKNOWN without both marks."""
    return window_of(trace, opened, ended)[0]


def window_of(trace: list[dict[str, Any]], opened: str, ended: str) -> tuple[int, int]:
    """:func:`peak_between_marks`, and the bytes allocated at ``ended`` above ``opened`` (UNKNOWN, 0
    without both marks)."""
    ends = [e["ts"] for e in trace if e.get("name") == ended]
    opens = [e["ts"] for e in trace if e.get("name") == opened and ends and e["ts"] <= ends[0]]
    if not opens:
        return UNKNOWN, 0
    cpu = torch.device("cpu")
    memory = sorted((e for e in trace if e.get("name") == "[memory]" and adapter.on_device(e["args"], cpu)),
                    key=lambda e: e["ts"])
    window = [e["args"] for e in memory if opens[-1] <= e["ts"] <= ends[0]]
    if not window:
        return 0, 0
    # a running total: the window's first event says where the window started
    start = window[0]["Total Allocated"] - window[0]["Bytes"]
    return peak_of_events(window), window[-1]["Total Allocated"] - start


def measure_loss(loss_fn: Callable[[Any], torch.Tensor], gm: Any) -> EagerParts:
    """The eager window of ``loss_fn`` after a graph, measured now on random outputs shaped like the
    graph's (those that need a gradient; one tensor, or a tuple of them): what ``remat.plan(..., loss_fn=)``
    counts instead of a reservation. Runs the loss and its backward, never the model."""
    (output,) = gm.graph.find_nodes(op="output")
    likes = [n.meta.get("example_value") for n in output.all_input_nodes]
    likes = [v for v in likes if isinstance(v, torch.Tensor) and v.requires_grad]
    if not likes:
        raise ValueError("loss_fn: the model's graph returns no tensor that needs a gradient")
    device = likes[0].device
    window = EagerWindow()
    window.arm(device)  # before the outputs are made, so that their frees are seen
    generator = torch.Generator(device).manual_seed(0)  # the caller's random stream stays as it was
    # outputs of an op, as the graph's are (a leaf would stay alive with the autograd graph)
    anchor = torch.zeros((), dtype=likes[0].dtype, device=device, requires_grad=True)
    outputs = [torch.randn([int(adapter.size_hint(s)) for s in v.shape], dtype=v.dtype, device=device,
                           generator=generator) + anchor.to(v.dtype) for v in likes]
    window.open(device, sum(t.numel() * t.element_size() for t in outputs))
    hooks = [t.register_hook(lambda grad: window.end()) for t in outputs]
    loss = loss_fn(outputs[0] if len(outputs) == 1 else tuple(outputs))
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
        window.cancel()
        raise ValueError("loss_fn must return a scalar tensor that depends on the model's output")
    del outputs  # the caller's step frees what it does not hold, as a loss computed in place does
    loss.backward()
    for hook in hooks:
        hook.remove()
    peak = window.close()
    return EagerParts(peak, window.after, None, 0, window.freed)
