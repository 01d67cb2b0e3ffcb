"""A peak diff: what three programs of one model hold at their peak, buffer by buffer.

    python -m bench.peak_diff llama                          # bench's CPU size: 4 layers, d=256, seq 256
    python -m bench.peak_diff gpt-softmax --seq 256 --out    # writes bench/results/<date>-peak-diff-gpt-softmax.md
    python -m bench.peak_diff gpt --layers 2 --width 64 --seq 64 --batch 2   # a small one, about a minute

On the same model and batch (CPU, float32):

- (a) eager, ``torch.utils.checkpoint`` around each block (``use_reentrant=False``);
- (b) ``torch.compile`` (Inductor) of that same checkpointed model;
- (c) remat at its smallest feasible budget (``remat.compile(model, budget_gb=<smallest>)``, the
  smallest read from ``remat.plan(model, *inputs).min_feasible_bytes``).

For each: the buffers alive at its peak, each with its size, what made it (the module, the ATen op;
under Inductor the generated buffer and the FX node whose value it holds), where it was born and where
it is freed; then what (b) and (c) hold at their peak beyond (a), grouped by role and module, and the
three peaks as the budget counts them (``remat.measure.budget_peak``: allocator peak during the step
above what was allocated before, plus the parameters, buffers and batch).

(a)'s live set is read from the CPU profiler's memory events (allocations and frees paired by address;
each attributed to the innermost ATen op around it, the module whose forward ran it, and in the backward
the autograd node, named with the module of its forward op). (b)'s and (c)'s come from the programs
Inductor generated, walked storage by storage as ``passes/inductor_account.py`` walks them for the
budget, with two corrections its walk lacks on ``torch.compile``'s checkpointed SDPA programs (an
extern kernel's nested tuple output no line allocates; RNG states handed to the backward under other
names). Each compiled live set is checked against the profiler's live set at the measured peak, size
by size; the test checks that every live set adds up to its measured peak (``tests/test_peak_diff.py``).
"Event N" is the N-th memory event of a program's walk (allocations, aliases, frees, kernel scratch),
not a wrapper line.

Roles: ``held`` (parameters, buffers, the batch), ``forward`` (born in the forward, peak in the forward),
``kept`` (born in the forward, alive at a backward peak: saved for the backward, or a checkpoint's block
input), ``recomputed`` (a forward op run again in the backward), ``backward`` (activation gradients and
temporaries, the loss's gradient), ``gradient`` (parameter gradients), ``scratch`` (an extern kernel's
workspace, as remat profiled it), ``before`` (memory allocated before the step and freed during it:
subtracted).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import operator
import pathlib
import platform
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

import remat
from bench.__main__ import SIZES
from bench.peers import blocks_of, checkpointed_blocks
from remat import zoo
from remat.errors import GIB
from remat.measure import budget_peak, held_bytes
from remat.passes import inductor_account as account
from remat.passes import torch_adapter as adapter
from remat.passes.measure import peak_of_events
from remat.passes.names import innermost_module
from remat.passes.torch_adapter import live_set

MIB = 2 ** 20
PROGRAMS = ("a", "b", "c")
TITLES = {"a": "(a) eager, checkpoint per block", "b": "(b) torch.compile, checkpoint per block",
          "c": "(c) remat, smallest feasible budget"}
# ops that only allocate for the op around them: a buffer is named by the op that asked for it
ALLOCATING = frozenset({"empty", "empty_strided", "empty_like", "resize_", "new_empty", "new_empty_strided"})
BACKWARD_MARK = "peak_diff: backward"
MODULE_RANGE = "module: "
EVALUATE = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class Buffer:
    """One storage alive at a program's peak."""

    bytes: int
    role: str  # held | forward | kept | recomputed | backward | gradient | scratch | before
    module: str  # the module that made it ("blocks.2.attn"), "" for the model's own code
    op: str  # the ATen op that made it (under Inductor: the op of the FX node whose value it holds)
    born: str
    freed: str


@dataclass
class LiveSet:
    """A program's live set at its peak, and the peak as the budget counts it."""

    program: str  # "a", "b" or "c"
    measured_bytes: int  # remat.measure.budget_peak of a step of the program
    peak_at: str
    buffers: list[Buffer]
    notes: list[str] = field(default_factory=list)
    accounted_bytes: int | None = None  # (b), (c): the peak of inductor_account.step_account

    @property
    def live_bytes(self) -> int:
        return sum(b.bytes for b in self.buffers)


# --------------------------------------------------------------------------
# Names shared by the three programs
# --------------------------------------------------------------------------


def short_op(name: str) -> str:
    """``aten::addmm`` and ``aten.addmm.default`` both as ``addmm``: the programs compare by it."""
    name = name.split("::", 1)[-1]
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] in ("aten", "prims", "higher_order") else name


def unwrapped(path: str) -> str:
    """A module path without the ``Checkpointed`` wrapper's ``.block`` (``blocks.2.block.attn``
    is ``blocks.2.attn``), so the checkpointed and plain models name modules alike."""
    return re.sub(r"^(blocks\.\d+)\.block(?=\.|$)", r"\1", path)


def group_of(module: str) -> str:
    """The module a summary row groups by: the block index starred, two levels inside a block
    (``blocks.*.attn``, ``blocks.*.mlp``), one outside it (``lm_head``)."""
    parts = module.split(".") if module else []
    if len(parts) >= 2 and parts[0] == "blocks" and parts[1].isdigit():
        return ".".join(["blocks", "*", *parts[2:3]])
    return parts[0] if parts else "(model's own code)"


def held_buffer(nbytes: int, count: int) -> Buffer:
    """The parameters, buffers and batch, as one row: every program holds the same ones."""
    return Buffer(nbytes, "held", "", "", f"before the step ({count} tensors: parameters, buffers, batch)",
                  "held by the caller")


# --------------------------------------------------------------------------
# (a) eager: the CPU profiler's memory events, paired by address
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# (b), (c): the programs Inductor generated, walked storage by storage
# --------------------------------------------------------------------------


@dataclass
class Lowered:
    """One program Inductor generated, with where each of its buffers came from."""

    program: account.Program
    origins: dict[str, list[fx.Node]]
    backward: bool
    sizes: dict[str, int] = field(default_factory=dict)  # buffer name -> bytes


@contextlib.contextmanager
def lowered_programs() -> Iterator[list[Lowered]]:
    """Every program Inductor generates in the block (caches off, the backward lowered with the
    forward), read as ``inductor_account`` reads it, its buffers' FX nodes beside. remat's own
    reading of the same programs (its compiles nest inside) is left as it would be."""
    found: list[Lowered] = []

    def seen(lowering: Any) -> None:
        with live_set.partitioned_outputs_kept():
            program = account.walk(lowering)
        found.append(Lowered(program, live_set.buffer_origins(lowering), live_set.is_backward(lowering),
                             live_set.buffer_bytes(lowering)))

    with adapter.on_inductor_codegen(seen):
        yield found


def pairs(lowered: list[Lowered]) -> list[tuple[Lowered, Lowered]]:
    """(forward, backward) programs in the order compiled; a forward whose backward was not
    generated (a cache hit) is skipped."""
    out, forward = [], None
    for item in lowered:
        if not item.backward:
            forward = item
        elif forward is not None:
            out.append((forward, item))
            forward = None
    return out


class Tracked(account.Storages):
    """``inductor_account``'s storages, each remembering the buffer whose value it holds (where
    that buffer was made: a reused storage holds its new buffer's value) and when each value
    ended (its storage freed, or reused for another buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.value: dict[int, tuple[str, str]] = {}  # storage -> (phase, buffer name) of what it holds
        self.at: dict[int, int] = {}  # storage -> the event its value was made at
        self.ends: dict[int, list[tuple[int, str]]] = defaultdict(list)  # storage -> (tick, where a value ended)
        self.phase, self.after, self.event, self.tick = "forward", "the program's start", 0, 0
        self.unallocated: list[str] = []  # tuple elements the account never allocates, added here

    def add(self, name: str, nbytes: int) -> None:
        super().add(name, nbytes)
        self.value[self.of[name]] = (self.phase, name)
        self.at[self.of[name]] = self.event

    def reuse(self, new: str, old: str) -> None:
        """Inductor's buffer reuse: ``new`` takes ``old``'s storage, and its value."""
        self.alias(new, old)
        if new in self.of:
            sid = self.of[new]
            self.ends[sid].append((self.tick, f"{self.phase} event {self.event}, its storage reused for {new}"))
            self.value[sid], self.at[sid] = (self.phase, new), self.event

    def drop(self, name: str) -> None:
        sid = self.of.get(name)
        super().drop(name)
        if sid is not None and self.refs[sid] == 0:
            self.ends[sid].append((self.tick, f"{self.phase} event {self.event}, after {self.after}"))

    def ended(self, sid: int, after: int) -> str:
        """Where the value a storage held at tick ``after`` ended."""
        return next((text for tick, text in self.ends[sid] if tick > after), "alive at the end of the step")


@dataclass
class Peak:
    """The highest point of a walk: its bytes, where, the storages alive with the value each held
    then (a storage reused later holds another buffer's by the end), and any kernel scratch."""

    bytes: int = -1
    at: str = ""
    alive: dict[int, int] = field(default_factory=dict)
    values: dict[int, tuple[tuple[str, str], int]] = field(default_factory=dict)  # storage -> (value, event)
    scratch: tuple[int, tuple[str, ...]] = (0, ())
    tick: int = 0

    def consider(self, storages: Tracked, where: str, extra: int = 0, origins: tuple[str, ...] = ()) -> None:
        if storages.alive + extra > self.bytes:
            self.bytes, self.at = storages.alive + extra, where
            self.alive = {sid: storages.size[sid] for sid, refs in storages.refs.items() if refs > 0}
            self.values = {sid: (storages.value[sid], storages.at.get(sid, 0)) for sid in self.alive}
            self.scratch, self.tick = (extra, origins), storages.tick


def short_list(names: tuple[str, ...], most: int = 4) -> str:
    """An extern kernel's FX nodes, the first few (a fused kernel lists every op inlined into it)."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def node_text(item: Lowered, name: str) -> str:
    """A buffer's FX node, as ``addmm_3 (addmm) in blocks.1.mlp.0``; the buffer name where Inductor
    kept none."""
    nodes = item.origins.get(name.split("[", 1)[0], [])
    if not nodes:
        return name
    module = unwrapped(innermost_module(nodes[0]) or "")
    return f"{nodes[0].name} ({op_of(nodes[0])})" + (f" in {module}" if module else "")


def walk_into(item: Lowered, storages: Tracked, peak: Peak, scratch: Callable[[tuple[str, ...]], int]) -> None:
    """``inductor_account.run`` over one program, keeping the peak's live set and each death. An
    alias whose old name is dropped at once is a ``ReuseLine``: the storage's value is the new buffer."""
    label, events = storages.phase, item.program.events
    peak.consider(storages, f"{label} start")
    for i, event in enumerate(events):
        storages.event, storages.tick = i, storages.tick + 1
        if event[0] == "scratch":
            storages.after = short_list(event[1]) or "an extern kernel"
            peak.consider(storages, f"{label} event {i} (extern kernel {storages.after})", scratch(event[1]), event[1])
            continue
        if event[0] == "alloc":
            storages.add(event[1], event[2])
            storages.after = f"{event[1]} = {node_text(item, event[1])}"
        elif event[0] == "alias" and i + 1 < len(events) and events[i + 1] == ("drop", event[2]):
            storages.reuse(event[1], event[2])
            storages.after = f"{event[1]} = {node_text(item, event[1])}"
        elif event[0] == "alias" and "[" in event[2] and event[2] not in storages.of and event[1] in item.sizes:
            # an element of a nested tuple an extern kernel returned, which no wrapper line allocates
            storages.add(event[2], item.sizes[event[1]])
            storages.unallocated.append(event[2])
            storages.alias(event[1], event[2])
            storages.value[storages.of[event[1]]] = (label, event[1])
        elif event[0] == "alias":
            storages.alias(event[1], event[2])
        elif event[0] == "drop":
            storages.drop(event[1])
        peak.consider(storages, f"{label} event {i} ({storages.after})")


def handed_by_position(forward: account.Program, backward: account.Program) -> dict[str, str]:
    """Backward input -> the forward output it is, for the inputs whose name no forward output has.

    AOTAutograd hands the backward the forward's trailing outputs, in order, before the tangents.
    ``inductor_account`` matches them by name, which holds for remat's graphs (it notes the
    partitioner's names) but not always for ``torch.compile``'s: Inductor's post-grad passes rename
    some forward outputs, and checkpointed regions hand their RNG states over as
    ``rng_state_output_N``. The account then counts such a value twice (a forward output held by the
    caller, and a tangent); matched by position here, it is counted once."""
    saved = [n for n in backward.fx_inputs if not n.startswith("tangents")]
    outputs = forward.fx_outputs
    if len(saved) > len(outputs):
        return {}
    pairs = zip(saved, outputs[len(outputs) - len(saved):])
    return {b: f for b, f in pairs if b != f and b not in outputs}


def replay(forward: Lowered, backward: Lowered, workspace: dict[str, int]) -> tuple[Peak, Tracked]:
    """One step of the two programs, combined as ``inductor_account.step_account`` combines them
    (the same storages, the same hand-off), keeping the live set at the peak."""
    storages, peak = Tracked(), Peak()

    def scratch(origins: tuple[str, ...]) -> int:
        return max((workspace.get(name, 0) for name in origins), default=0)

    storages.phase = "input"
    for name, nbytes in forward.program.inputs.items():
        storages.add(name, nbytes)
        storages.pin(name)
    storages.phase = "forward"
    walk_into(forward, storages, peak, scratch)
    storages.after, storages.tick = "the forward returned (not handed to the backward)", storages.tick + 1
    handed = account.returned(forward.program, storages)
    for name in list(forward.program.inputs):
        storages.drop(name)
    storages.phase = "backward input"
    renamed = handed_by_position(forward.program, backward.program)
    for fx_name, name in zip(backward.program.fx_inputs, backward.program.inputs):
        source = fx_name if fx_name in handed else renamed.get(fx_name)
        if source in handed:
            storages.bind(name, handed[source])
            storages.refs[handed[source]] -= 1
        else:  # a tangent: held by autograd to the end of the step
            storages.add(name, backward.program.inputs[name])
            storages.pin(name)
    storages.phase = "backward"
    walk_into(backward, storages, peak, scratch)
    return peak, storages


def op_of(node: fx.Node) -> str:
    """The op of an FX node; an element of a multi-output op is its op's (``getitem`` of ``var_mean``)."""
    if node.target is operator.getitem and node.args and isinstance(node.args[0], fx.Node):
        return op_of(node.args[0])
    if hasattr(node.target, "overloadpacket"):  # an OpOverload
        return short_op(str(node.target))  # aten.addmm.default
    return str(getattr(node.target, "__name__", node.target))


def compiled_buffer(sid: int, nbytes: int, peak: Peak, storages: Tracked, programs: dict[str, Lowered]) -> Buffer:
    """A storage alive at a compiled program's peak, named by the FX node its buffer holds. A
    backward buffer the backward returns is a parameter's gradient."""
    (phase, name), event = peak.values[sid]
    freed = storages.ended(sid, peak.tick)
    if phase == "backward input":  # not handed over by the forward: autograd's gradient of a forward output
        return Buffer(nbytes, "backward", "", "tangent", f"backward input {name} (a forward output's gradient)", freed)
    item = programs[phase]
    nodes = item.origins.get(name.split("[", 1)[0], [])
    node = nodes[0] if nodes else None
    module = unwrapped(innermost_module(node) or "") if node is not None else ""
    born = f"{phase} event {event}: {name} = {node_text(item, name)}"
    if phase == "forward":
        role = "kept" if peak.at.startswith("backward") else "forward"
    elif name in programs["backward"].program.outputs:
        role = "gradient"
    elif node is not None and node.meta.get("partitioner_tag") == "is_forward":
        role = "recomputed"
    else:
        role = "backward"
    return Buffer(nbytes, role, module, op_of(node) if node is not None else "", born, freed)


def compiled_buffers(forward: Lowered, backward: Lowered,
                     workspace: dict[str, int]) -> tuple[Peak, list[Buffer], list[str]]:
    """The live set at the peak of one step of a (forward, backward) pair, and the tuple elements
    added that the account does not allocate."""
    peak, storages = replay(forward, backward, workspace)
    programs = {"forward": forward, "backward": backward}
    inputs = [sid for sid in peak.alive if peak.values[sid][0][0] == "input"]
    buffers = [held_buffer(sum(peak.alive[s] for s in inputs), len(inputs))] if inputs else []
    for sid, nbytes in peak.alive.items():
        if sid not in inputs:
            buffers.append(compiled_buffer(sid, nbytes, peak, storages, programs))
    extra, origins = peak.scratch
    if extra:
        buffers.append(Buffer(extra, "scratch", "", short_list(origins), f"while {short_list(origins)} runs",
                              "when it returns"))
    return peak, buffers, storages.unallocated


def step_peak(model: nn.Module, run: Callable[..., torch.Tensor], inputs: tuple) -> int:
    """A step's peak as the budget counts it, gradients cleared before and after."""
    model.zero_grad(set_to_none=True)
    peak = budget_peak(lambda: run(*inputs).backward(), model, inputs, "cpu")
    model.zero_grad(set_to_none=True)
    return peak


def profiled_sizes(model: nn.Module, run: Callable[..., torch.Tensor], inputs: tuple) -> Counter[int]:
    """The sizes of the allocations alive at a step's peak, as the CPU profiler saw them (bytes
    allocated before the step and freed before its peak counted negative): the cross-check of a
    compiled program's account, whose buffers the profiler cannot name."""
    model.zero_grad(set_to_none=True)
    events = traced_events(lambda: run(*inputs).backward())
    model.zero_grad(set_to_none=True)
    memory, contexts, _, _ = eager_allocations(events)
    _, alive, before = live_at_peak(memory, contexts)
    return Counter([a.bytes for a in alive] + ([-before] if before else []))


def account_check(live: LiveSet, profiled: Counter[int]) -> None:
    """Note where the account's live set and the profiler's differ, size by size."""
    accounted = Counter(b.bytes for b in live.buffers if b.role != "held")
    only_account, only_profiler = accounted - profiled, profiled - accounted
    if only_account or only_profiler:
        live.notes.append(
            f"the profiler's live set at the measured peak differs from the account's: sizes only in the account "
            f"{sorted(only_account.elements())} B, only in the profiler's {sorted(only_profiler.elements())} B")
    else:
        live.notes.append(f"the profiler's live set at the measured peak has the account's sizes, one for one "
                          f"({sum(profiled.values())} allocations)")


def compiled_live_set(model: nn.Module, inputs: tuple) -> LiveSet:
    """(b): ``torch.compile`` of the checkpointed model; the account of its program, no kernel
    scratch (torch did not profile one)."""
    adapter.reset_compiled()
    with checkpointed_blocks(model):
        compiled = torch.compile(model)
        with lowered_programs() as lowered:
            compiled(*inputs).backward()
        measured = step_peak(model, compiled, inputs)
        profiled = profiled_sizes(model, compiled, inputs)
    adapter.reset_compiled()
    (forward, backward), = pairs(lowered)
    live = compiled_set("b", forward, backward, {}, measured)
    account_check(live, profiled)
    return live


def compiled_set(program: str, forward: Lowered, backward: Lowered, workspace: dict[str, int],
                 measured: int) -> LiveSet:
    peak, buffers, unallocated = compiled_buffers(forward, backward, workspace)
    accounted = account.step_account([forward.program, backward.program], workspace)
    live = LiveSet(program, measured, peak.at, buffers, accounted_bytes=accounted.peak_bytes)
    if not accounted.complete:
        live.notes.append(f"the account is incomplete: {accounted.incomplete_reason}")
    renamed = handed_by_position(forward.program, backward.program)
    if unallocated:
        live.notes.append(f"{len(unallocated)} extern-kernel output(s) that no wrapper line allocates (elements of "
                          f"a nested tuple: {short_list(tuple(unallocated))}) added at their first use, with their "
                          f"layout's bytes; inductor_account leaves them out")
    if renamed:
        live.notes.append(f"{len(renamed)} backward input(s) named otherwise than the forward output they are, "
                          f"matched by position ({short_list(tuple(f'{b} = {f}' for b, f in renamed.items()))}); "
                          f"inductor_account matches by name and counts each twice")
    if renamed or unallocated:
        live.notes.append(f"so inductor_account's own peak for this program is {accounted.peak_bytes} B "
                          f"({accounted.peak_bytes / MIB:.2f} MiB), the live set here {peak.bytes} B")
    elif accounted.peak_bytes != peak.bytes:  # the replay is the account's own walk: a difference is a bug here
        live.notes.append(f"replay peak {peak.bytes} B differs from the account's {accounted.peak_bytes} B")
    return live


def smallest_budget(model: nn.Module, inputs: tuple) -> int:
    """remat's smallest feasible budget, as ``remat.plan`` computes it (the lower compiled peak of
    its smallest-peak and fastest plans: a budget ``remat.compile`` accepts), the figure the
    report names."""
    adapter.reset_compiled()
    try:
        return remat.plan(model, *inputs, plan_cache=False).min_feasible_bytes
    finally:
        adapter.reset_compiled()


def remat_live_set(model: nn.Module, inputs: tuple) -> LiveSet:
    """(c): remat compiled at its smallest feasible budget. Of the programs its fitting loop
    generated, the one it runs is the last whose account (with remat's profiled kernel scratch)
    equals the report's compiled peak."""
    budget = smallest_budget(model, inputs)
    compiled = remat.compile(model, budget_gb=budget / GIB, plan_cache=False)
    with lowered_programs() as lowered:
        compiled(*inputs).backward()
    report = remat.reports(compiled)[0]
    measured = step_peak(model, compiled, inputs)
    profiled = profiled_sizes(model, compiled, inputs)
    adapter.reset_compiled()
    workspace = {row.name: row.workspace for row in report.nodes if row.workspace}
    found = pairs(lowered)
    runs = [p for p in found if account.step_account([p[0].program, p[1].program], workspace).peak_bytes
            == report.compiled_peak_bytes]
    live = compiled_set("c", *(runs or found)[-1], workspace, measured)
    live.notes.append(f"budget {budget} B ({budget / MIB:.2f} MiB), remat's smallest feasible; "
                      f"{len(found)} program(s) compiled at it, report's compiled peak {report.compiled_peak_bytes} B, "
                      f"recomputes {len(report.recomputed)} values")
    if not runs:
        live.notes.append("no program's account equals the report's compiled peak: the last one compiled is shown")
    account_check(live, profiled)
    return live


# --------------------------------------------------------------------------
# The diff and the report
# --------------------------------------------------------------------------


def live_sets(model: nn.Module, inputs: tuple, programs: tuple[str, ...] = PROGRAMS) -> dict[str, LiveSet]:
    """The live sets at the peak of the programs asked for, on the same model and batch."""
    make = {"a": eager_live_set, "b": compiled_live_set, "c": remat_live_set}
    return {p: make[p](model, inputs) for p in programs}


def grouped(live: LiveSet) -> dict[tuple[str, str], tuple[int, set[str]]]:
    """(role, module group) -> (bytes, ops): what a summary row compares."""
    out: dict[tuple[str, str], tuple[int, set[str]]] = defaultdict(lambda: (0, set()))
    for b in live.buffers:
        key = (b.role, group_of(b.module) if b.role not in ("held", "before", "scratch") else "")
        nbytes, ops = out[key]
        out[key] = (nbytes + b.bytes, ops | ({b.op} if b.op else set()))
    return dict(out)


def diff_rows(sets: dict[str, LiveSet]) -> list[dict[str, Any]]:
    """One row per (role, module group) that (b) or (c) holds more of at its peak than (a),
    the largest excess first."""
    groups = {p: grouped(s) for p, s in sets.items()}
    keys = sorted({k for g in groups.values() for k in g})
    rows = []
    for key in keys:
        sizes = {p: groups[p].get(key, (0, set()))[0] for p in sets}
        excess = max((sizes[p] - sizes.get("a", 0) for p in sets if p != "a"), default=0)
        if excess > 0:
            ops = sorted(set().union(*(groups[p].get(key, (0, set()))[1] for p in sets if p != "a")))
            rows.append({"role": key[0], "module": key[1], "bytes": sizes, "excess": excess, "ops": ops})
    return sorted(rows, key=lambda r: -r["excess"])


def mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.2f}"


def peaks_table(sets: dict[str, LiveSet]) -> str:
    lines = ["| program | measured peak MiB (budget_peak) | live set at the peak MiB | peak at |", "|---|---|---|---|"]
    for p, s in sets.items():
        lines.append(f"| {TITLES[p]} | {mib(s.measured_bytes)} | {mib(s.live_bytes)} | {s.peak_at} |")
    return "\n".join(lines) + "\n"


def diff_table(sets: dict[str, LiveSet]) -> str:
    others = [p for p in sets if p != "a"]
    head = "| role | module | " + " | ".join(f"({p}) MiB" for p in sets) + " | made by (ops, in " \
           + "/".join(f"({p})" for p in others) + ") |"
    lines = [head, "|" + "---|" * (3 + len(sets))]
    for r in diff_rows(sets):
        sizes = " | ".join(mib(r["bytes"][p]) for p in sets)
        lines.append(f"| {r['role']} | {r['module']} | {sizes} | {', '.join(r['ops'][:8])} |")
    totals = " | ".join(mib(s.live_bytes) for s in sets.values())
    lines.append(f"| **total** | | {totals} | |")
    return "\n".join(lines) + "\n"


def buffers_table(live: LiveSet) -> str:
    lines = ["| bytes | MiB | role | module | op | born | freed |", "|---|---|---|---|---|---|---|"]
    for b in sorted(live.buffers, key=lambda b: -b.bytes):
        lines.append(f"| {b.bytes} | {b.bytes / MIB:.3f} | {b.role} | {b.module} | {b.op} | {b.born} | {b.freed} |")
    return "\n".join(lines) + "\n"


def markdown(sets: dict[str, LiveSet], title: str, command: str, written: bool = False) -> str:
    """The report: peaks side by side, what (b)/(c) hold beyond (a), then each live set in full."""
    out = [f"# {title}\n\n", f"Command: `{command}`" + (" (with `--out`, this file)" if written else "") + "\n\n",
           "## The three peaks\n\n", peaks_table(sets),
           "\n## What the compiled programs hold at their peak beyond eager checkpointing\n\n",
           "Bytes alive at each program's own peak, by role and module (blocks starred); rows where (b) or (c) "
           "holds more than (a), the largest excess first.\n\n", diff_table(sets)]
    for p, s in sets.items():
        out.append(f"\n## {TITLES[p]}: {len(s.buffers)} buffers alive at the peak\n\n")
        out += [f"- {note}\n" for note in s.notes]
        out.append(("\n" if s.notes else "") + buffers_table(s))
    return "".join(out)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peak_diff", description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=[m for m in zoo.names() if m in ("gpt", "gpt-softmax", "llama", "vit")],
                        help="a zoo model with a .blocks list to checkpoint")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--width", type=int, help="d_model")
    parser.add_argument("--programs", nargs="+", choices=PROGRAMS, default=list(PROGRAMS))
    parser.add_argument("--out", nargs="?", const="bench/results", default=None,
                        help="write <date>-peak-diff-<model>.md into this folder (bench/results if none given)")
    return parser.parse_args(argv)


def size_of(args: argparse.Namespace) -> dict[str, Any]:
    """bench's CPU size for the model, with the flags given over it."""
    size = dict(SIZES["cpu"].get(args.model, {}))
    flags = {"batch": args.batch, "seq": args.seq, "layers": args.layers, "d_model": args.width}
    size.update({k: v for k, v in flags.items() if v is not None})
    return size


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    size = size_of(args)
    model, inputs = zoo.build(args.model, **size)
    sets = live_sets(model, inputs, tuple(args.programs))
    today = dt.date.today().isoformat()
    flags = "".join(f" --{k} {v}" for k, v in (("batch", args.batch), ("seq", args.seq), ("layers", args.layers),
                                                 ("width", args.width)) if v is not None)
    command = f"python -m bench.peak_diff {args.model}{flags}" + (
        f" --programs {' '.join(args.programs)}" if tuple(args.programs) != PROGRAMS else "")
    title = (f"Peak diff, {args.model}, {today}, CPU, torch {torch.__version__}, python {platform.python_version()}, "
             f"float32, {', '.join(f'{k}={v}' for k, v in size.items())}")
    text = markdown(sets, title, command, written=args.out is not None)
    if args.out is None:
        print(text)
    else:
        path = pathlib.Path(args.out) / f"{today}-peak-diff-{args.model}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(peaks_table(sets) + "\n" + diff_table(sets) + f"\nwrote {path}")
    return text


if __name__ == "__main__":
    main()
