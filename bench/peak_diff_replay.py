"""How the peak diff reads a program Inductor generated: a replay of ``inductor_account``'s walk
(the same storages, the same hand-off from forward to backward) that keeps the live set at the peak,
each storage named by the FX node whose value it holds and where that value ended, with two
corrections the account's walk lacks on ``torch.compile``'s checkpointed SDPA programs (an extern
kernel's nested tuple output no line allocates; RNG states handed to the backward under other
names). ``bench/peak_diff_compiled.py`` runs the programs and hands them here.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.fx as fx

from bench.peak_diff_live_set import Buffer, held_buffer, short_op, unwrapped
from remat.passes.program import inductor_account as account
from remat.passes.capture.names import innermost_module


@dataclass
class Lowered:
    """One program Inductor generated, with where each of its buffers came from."""

    program: account.Program
    origins: dict[str, list[fx.Node]]
    backward: bool
    sizes: dict[str, int] = field(default_factory=dict)  # buffer name -> bytes


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
