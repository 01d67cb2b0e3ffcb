"""The peak diff's program (a), eager with ``torch.utils.checkpoint`` around each block: its live
set at the peak read from the CPU profiler's memory events, allocations and frees paired by address,
each attributed to the innermost ATen op around it, the module whose forward ran it and, in the
backward, the autograd node. The pairing (:func:`eager_allocations`, :func:`live_at_peak`) also
cross-checks the compiled programs' live sets (``bench/peak_diff_compiled.py``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.peak_diff_live_set import Buffer, LiveSet, held_buffer, short_op, unwrapped
from bench.peers import blocks_of, checkpointed_blocks
from remat.measure import budget_peak, held_bytes
from remat.passes import torch_adapter as adapter
from remat.passes.program.measure import peak_of_events

# ops that only allocate for the op around them: a buffer is named by the op that asked for it
ALLOCATING = frozenset({"empty", "empty_strided", "empty_like", "resize_", "new_empty", "new_empty_strided"})
BACKWARD_MARK = "peak_diff: backward"
MODULE_RANGE = "module: "
EVALUATE = "autograd::engine::evaluate_function: "


@contextlib.contextmanager
def module_ranges(model: nn.Module) -> Iterator[None]:
    """A profiler range ``module: <path>`` around each module's forward (checkpoint's recompute runs
    it again inside the backward), so an allocation knows the module that made it. The range closes
    even where the forward raises: checkpoint stops a recompute early by raising inside it."""
    open_ranges: list[Any] = []

    def enter(name: str, *_: Any) -> None:
        open_ranges.append(torch.profiler.record_function(MODULE_RANGE + unwrapped(name)))
        open_ranges[-1].__enter__()

    def leave(*_: Any) -> None:
        open_ranges.pop().__exit__(None, None, None)

    handles = []
    for name, module in model.named_modules():
        if name:
            handles += [module.register_forward_pre_hook(functools.partial(enter, name)),
                        module.register_forward_hook(leave, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def block_inputs(model: nn.Module) -> Iterator[dict[int, tuple[int, int]]]:
    """Storage address -> (block index, bytes) of each checkpointed block's input, the tensor
    ``torch.utils.checkpoint`` keeps for the backward (addresses only: holding the tensors would
    keep them alive)."""
    found: dict[int, tuple[int, int]] = {}

    def seen(index: int, _module: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor):
            storage = args[0].untyped_storage()
            found[storage.data_ptr()] = (index, storage.nbytes())

    handles = [block.register_forward_pre_hook(functools.partial(seen, i)) for i, block in enumerate(blocks_of(model))]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def traced_events(step: Callable[[], None]) -> list[dict[str, Any]]:
    """Every trace event of one step, under a profiler session of remat's own (the one
    ``remat.measure`` reads peaks from)."""
    session = adapter.OwnSession()
    session.start()
    try:
        step()
    finally:
        session.stop()
    return session.events or []


def enclosing(ranges: list[dict], times: list[float]) -> list[tuple[dict, ...]]:
    """For each time (ascending), the ranges around it, outermost first: one sweep over ranges
    sorted by start (the longer first), a range closing after its end."""
    ranges = sorted(ranges, key=lambda e: (e["ts"], -e["dur"]))
    stacks, stack, i = [], [], 0
    for t in times:
        while i < len(ranges) and ranges[i]["ts"] <= t:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < ranges[i]["ts"]:
                stack.pop()
            stack.append(ranges[i])
            i += 1
        while stack and stack[-1]["ts"] + stack[-1]["dur"] < t:
            stack.pop()
        stacks.append(tuple(stack))
    return stacks


@dataclass(frozen=True)
class Context:
    """Where an allocation or free happened in an eager step."""

    backward: bool
    module: str  # the module whose forward ran it ("" none)
    op: str  # the innermost ATen op that is not a bare allocation ("" none)
    node: str  # in the backward, the autograd node ("MmBackward0")
    seq: int | None  # that node's sequence number: its forward op's

    def text(self, seq_modules: dict[int, str]) -> str:
        """``backward MmBackward0 (of blocks.1.mlp.2) aten::mm``: a backward node is named with the
        module of its forward op; a module's own range (a forward, or checkpoint's recompute) with ``in``."""
        parts = ["backward" if self.backward else "forward"]
        if self.node:
            of = seq_modules.get(self.seq, "") if self.seq is not None else ""
            parts.append(self.node + (f" (of {of})" if of else ""))
        parts.append(f"aten::{self.op}" if self.op else "(no ATen op)")
        if self.module:
            parts.append(f"in {self.module}")
        return " ".join(parts)


def context_of(stack: tuple[dict, ...], backward: bool) -> Context:
    """The innermost module range, ATen op and autograd node of ``stack``. The op is the innermost
    ATen op that is not a bare allocation for the op around it, nor the autograd node's own range."""
    module, node, seq = "", "", None
    for e in stack:
        if e["name"].startswith(MODULE_RANGE):
            module = e["name"][len(MODULE_RANGE):]
        elif e["name"].startswith(EVALUATE):
            node, seq = e["name"][len(EVALUATE):], e.get("args", {}).get("Sequence number")
    ops = [short_op(e["name"]) for e in stack if e.get("cat") == "cpu_op"
           and not e["name"].startswith("autograd::") and e["name"] != node]
    named = [o for o in ops if o not in ALLOCATING] or ops or [""]
    return Context(backward, module, named[-1], node, seq)


def forward_modules(ranges: list[dict], backward_at: float) -> dict[int, str]:
    """Sequence number -> the module whose forward ran that op: a backward node carries its
    forward op's number, so a gradient is named by the module it is the gradient of."""
    ops = sorted((e for e in ranges if e.get("cat") == "cpu_op" and e["ts"] < backward_at
                  and "Sequence number" in e.get("args", {})), key=lambda e: e["ts"])
    out = {}
    for op, stack in zip(ops, enclosing(ranges, [e["ts"] for e in ops])):
        module = context_of(stack, False).module
        out.setdefault(op["args"]["Sequence number"], module)
    return out


@dataclass
class Allocation:
    index: int  # the memory event's position
    addr: int
    bytes: int
    born: Context
    freed: Context | None = None


def eager_allocations(events: list[dict]) -> tuple[list[dict], list[Context], float, dict[int, str]]:
    """The CPU memory events in order, the context of each, when the backward started, and the
    forward module of each sequence number."""
    memory = [e for e in events if e.get("name") == "[memory]" and adapter.on_device(e["args"], torch.device("cpu"))]
    ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    marks = [e["ts"] for e in ranges if e["name"] == BACKWARD_MARK]
    backward_at = marks[0] if marks else float("inf")
    stacks = enclosing(ranges, [e["ts"] for e in memory])
    contexts = [context_of(s, e["ts"] >= backward_at) for e, s in zip(memory, stacks)]
    return memory, contexts, backward_at, forward_modules(ranges, backward_at)


def live_at_peak(memory: list[dict], contexts: list[Context]) -> tuple[int, list[Allocation], int]:
    """The memory event at the step's peak (the first at the highest running total), the
    allocations alive there (each with where it is freed later, if it is), and the bytes freed
    before it that were allocated before the step (no allocation of theirs in the session)."""
    totals = [e["args"]["Total Allocated"] for e in memory]
    peak = totals.index(max(totals))
    alive: dict[int, Allocation] = {}
    before = 0
    for i, e in enumerate(memory[:peak + 1]):
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0:
            alive[addr] = Allocation(i, addr, nbytes, contexts[i])
        elif addr in alive:
            del alive[addr]
        else:
            before -= nbytes
    for i, e in enumerate(memory[peak + 1:], peak + 1):
        found = alive.get(e["args"]["Addr"])
        if e["args"]["Bytes"] < 0 and found is not None and found.freed is None:
            found.freed = contexts[i]
    return peak, list(alive.values()), before


def eager_role(a: Allocation, peak_backward: bool, grads: set[int]) -> str:
    """What an allocation alive at the peak is to the step (see the module docstring's roles)."""
    if not a.born.backward:
        return "kept" if peak_backward else "forward"
    if a.born.module:
        return "recomputed"  # a module's forward ran inside the backward: checkpoint's recompute
    return "gradient" if a.addr in grads and a.freed is None else "backward"


def eager_buffer(a: Allocation, role: str, seq_modules: dict[int, str], kept: dict[int, tuple[int, int]]) -> Buffer:
    module = a.born.module or (seq_modules.get(a.born.seq, "") if a.born.seq is not None else "")
    born = a.born.text(seq_modules)
    if a.addr in kept and not a.born.backward and kept[a.addr][1] == a.bytes:
        born += f" (the input checkpoint keeps for blocks.{kept[a.addr][0]})"
    freed = a.freed.text(seq_modules) if a.freed else "alive at the end of the step"
    return Buffer(a.bytes, role, module, a.born.op, born, freed)


def eager_step(model: nn.Module, inputs: tuple) -> Callable[[], None]:
    """One training step, the backward's start marked in the profiler's trace."""

    def step() -> None:
        loss = model(*inputs)
        adapter.profiler_mark(BACKWARD_MARK)
        loss.backward()

    return step


def eager_live_set(model: nn.Module, inputs: tuple) -> LiveSet:
    """(a): the step run eagerly with each block checkpointed; its live set from the profiler.

    The peak the budget counts is measured on a step with no hooks of ours; the live set on a second
    step with module ranges (the two must agree: the ranges allocate nothing)."""
    step = eager_step(model, inputs)
    with checkpointed_blocks(model):
        step()  # a warm-up, as every peer gets
        model.zero_grad(set_to_none=True)
        measured = budget_peak(step, model, inputs, "cpu")
        model.zero_grad(set_to_none=True)
        with module_ranges(model), block_inputs(model) as kept:
            events = traced_events(step)
        grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
    memory, contexts, _, seq_modules = eager_allocations(events)
    peak, alive, before = live_at_peak(memory, contexts)
    at = contexts[peak]
    tensors = [*model.parameters(), *model.buffers(), *inputs]
    buffers = [held_buffer(held_bytes(model, inputs), len(tensors))]
    for a in sorted(alive, key=lambda a: a.index):
        buffers.append(eager_buffer(a, eager_role(a, at.backward, grads), seq_modules, kept))
    if before:
        buffers.append(Buffer(-before, "before", "", "", "before the step", "freed during the step, before the peak"))
    traced = peak_of_events([e["args"] for e in memory]) + held_bytes(model, inputs)
    live = LiveSet("a", measured, f"{at.text(seq_modules)} (memory event {peak} of {len(memory)})", buffers)
    if traced != measured:
        live.notes.append(f"the traced step (module ranges on) peaked at {traced} B, the plain step at {measured} B")
    return live
