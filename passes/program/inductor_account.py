"""The memory of the program Inductor generates, known before the step runs.

When Inductor's ``GraphLowering.codegen`` returns, its wrapper's line list is
final: fusion, reordering, buffer reuse and frees are decided. Walking it
storage by storage gives what the compiled ``call()`` holds at each line:

- ``AllocateLine``: a new storage of the node's allocation size;
- ``ReuseLine``: the new name takes the old storage (the old name is dropped
  when ``delete_old``, unless it is a graph output);
- ``ReinterpretLine`` and ``MultiOutputLine``: a second name for a storage;
- ``FreeIfNotReusedLine``: drops the name unless its storage was reused;
- ``FreeLine``: drops the program's reference to a graph input (the storage
  lives on while the caller holds it: parameters do, saved activations don't);
- ``ExternKernelAllocLine``: an extern kernel that allocates its own
  output(s) (every element of a tuple, at once), unless it wrote into a buffer
  allocated before or returns an alias of an input;
- extern kernel calls (``ExternKernelOutLine`` and the allocating ones) hold
  scratch no line shows (convolution, cuBLAS, cuDNN, attention workspaces):
  the caller passes each FX node's measured workspace, held while it runs;
- generated kernels allocate nothing.
- CUDA sizes are rounded up to the caching allocator's 512-byte blocks.

A forward and a backward combine into one step the way the budget counts it:
the forward's inputs are held throughout; its outputs survive it (the values
saved for the backward until the backward frees them, the rest to the end);
the backward's gradients and the tangents are held to the end. An unknown
memory-planning line makes the account incomplete, said in
``StepAccount.incomplete_reason``, never silently partial.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from .. import torch_adapter as adapter

__all__ = ["Program", "StepAccount", "capture_programs", "step_account"]


@dataclass
class Program:
    """One generated ``call()``: its inputs, memory events and outputs."""

    inputs: dict[str, int]  # name -> bytes
    # ("alloc", name, bytes) | ("alias", new, old) | ("drop", name) | ("scratch", origin node names)
    events: list[tuple] = field(default_factory=list)
    outputs: list[str | None] = field(default_factory=list)  # storage-owning names, in output order
    unknown: list[str] = field(default_factory=list)  # line kinds the walk does not know
    fx_inputs: list[str] = field(default_factory=list)  # the FX graph's placeholder names, in order
    fx_outputs: list[str] = field(default_factory=list)  # the FX graph's output names, in order


@dataclass(frozen=True)
class StepAccount:
    peak_bytes: int
    peak_at: str  # "forward" or "backward", and the line index
    complete: bool
    incomplete_reason: str = ""
    handoff_bytes: int = 0  # alive when the forward returns: its inputs and what it hands the backward
    backward_peak_bytes: int = 0  # the backward's own peak (peak_bytes is the larger of it and the forward's)
    forward_peak_bytes: int = 0
    # the forward's outputs the backward does not take (the caller's: logits a loss outside reads), which
    # the account holds to the end of the step as the caller may
    output_bytes: int = 0


@contextlib.contextmanager
def capture_programs() -> Iterator[list[Program]]:
    """Record every program Inductor generates inside the block (the backward
    lowered with the forward, caches off so that nothing skips code generation)."""
    programs: list[Program] = []
    with adapter.on_inductor_codegen(lambda lowering: programs.append(walk(lowering))):
        yield programs


def walk(lowering: object) -> Program:
    """The memory events of one lowered graph's final wrapper lines."""
    granularity = adapter.allocation_granularity(lowering)
    program = Program(inputs=adapter.graph_input_bytes(lowering),
                      fx_inputs=adapter.fx_placeholder_names(lowering),
                      fx_outputs=adapter.fx_output_names(lowering))
    for line in adapter.wrapper_lines(lowering):
        try:
            kind, event = adapter.memory_event(line)
        except Exception as exc:  # a line shape this torch version changed: say so, never guess
            kind, event = "unknown", f"{type(line).__name__} ({type(exc).__name__}: {exc})"
        if kind == "unknown":
            program.unknown.append(event)
        elif kind == "events":
            program.events.extend(rounded(e, granularity) for e in event)
    program.outputs = adapter.graph_output_names(lowering)
    return program


def rounded(event: tuple, granularity: int) -> tuple:
    if event[0] != "alloc" or granularity == 1:
        return event
    return (event[0], event[1], -(-event[2] // granularity) * granularity)


class Storages:
    """Names -> storages, with reference counts and the bytes alive."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self.size: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.alive = 0
        self.next_id = 0
        self.parts: dict[str, list[str]] = {}  # a tuple's name -> its elements' names ("buf5[0]", ...)

    def add(self, name: str, nbytes: int) -> None:
        if "[" in name:
            self.parts.setdefault(name.split("[", 1)[0], []).append(name)
        sid, self.next_id = self.next_id, self.next_id + 1
        self.size[sid] = nbytes
        self.refs[sid] = 0
        self.alive += self.size[sid]
        self.bind(name, sid)

    def bind(self, name: str, sid: int) -> None:
        self.drop(name)
        self.of[name] = sid
        self.refs[sid] += 1

    def alias(self, new: str, old: str) -> None:
        if old in self.of:
            self.bind(new, self.of[old])

    def drop(self, name: str) -> None:
        """Drop ``name``; for an extern kernel's tuple, its elements' names too
        (``del buf5`` frees the tuple, and with it every element no other name holds)."""
        for part in self.parts.pop(name, ()):
            self.drop(part)
        sid = self.of.pop(name, None)
        if sid is None:
            return
        self.refs[sid] -= 1
        if self.refs[sid] == 0:
            self.alive -= self.size[sid]

    def pin(self, name: str) -> None:
        """Hold ``name``'s storage beyond the program (an output)."""
        if name in self.of:
            self.refs[self.of[name]] += 1


def run(program: Program, storages: Storages, label: str, scratch: Callable[[tuple[str, ...]], int]) -> tuple[int, str]:
    """Walk ``program`` over ``storages``; (peak bytes, where). Its inputs must already be
    bound in ``storages``. ``scratch(origins)``: bytes an extern kernel holds while it runs."""
    peak, where = storages.alive, f"{label} start"
    for i, event in enumerate(program.events):
        if event[0] == "scratch":
            extra = scratch(event[1])
            if storages.alive + extra > peak:
                peak, where = storages.alive + extra, f"{label} line {i} (kernel scratch {extra} B)"
            continue
        if event[0] == "alloc":
            storages.add(event[1], event[2])
        elif event[0] == "alias":
            storages.alias(event[1], event[2])
        elif event[0] == "drop":
            storages.drop(event[1])
        if storages.alive > peak:
            peak, where = storages.alive, f"{label} line {i}"
    return peak, where


def returned(program: Program, storages: Storages) -> dict[str, int]:
    """Pin the outputs and let every local die: FX output name -> storage id."""
    by_fx = {}
    for fx_name, name in zip(program.fx_outputs, program.outputs):
        if name is not None and name in storages.of:
            storages.pin(name)
            by_fx[fx_name] = storages.of[name]
    for name in [n for n in storages.of if n not in program.inputs]:
        storages.drop(name)
    return by_fx


def step_account(programs: list[Program], workspace: Mapping[str, int] | None = None) -> StepAccount:
    """Peak bytes of one forward + backward step of the captured programs.

    ``workspace``: scratch bytes measured per FX node (the profile's); an extern kernel's
    scratch is the largest of the nodes it came from, held while it runs."""
    workspace = workspace or {}

    def scratch(origins: tuple[str, ...]) -> int:
        return max((workspace.get(name, 0) for name in origins), default=0)

    if len(programs) != 2:
        raise RuntimeError(f"expected one forward and one backward program from Inductor, saw {len(programs)}: "
                           "a cache hit skips code generation (remat turns the caches off while it compiles)")
    forward, backward = programs
    storages = Storages()
    for name, nbytes in forward.inputs.items():
        storages.add(name, nbytes)
        storages.pin(name)  # the caller holds parameters, buffers and the batch
    fwd_peak, fwd_where = run(forward, storages, "forward", scratch)
    handed = returned(forward, storages)
    handoff = storages.alive
    taken = {handed[fx] for fx in backward.fx_inputs if fx in handed}
    caller_outputs = {sid for fx, sid in handed.items() if sid not in taken}
    output_bytes = sum(storages.size[sid] for sid in caller_outputs)
    for name in list(forward.inputs):
        storages.drop(name)  # the pins above hold them; forward's names are out of scope
    for fx_name, name in zip(backward.fx_inputs, backward.inputs):
        if fx_name in handed:
            storages.bind(name, handed[fx_name])
            storages.refs[handed[fx_name]] -= 1  # the backward's argument is the last holder of a saved value
        else:  # a tangent: held by autograd to the end of the step
            storages.add(name, backward.inputs[name])
            storages.pin(name)
    bwd_peak, bwd_where = run(backward, storages, "backward", scratch)
    peak, where = max((fwd_peak, fwd_where), (bwd_peak, bwd_where))
    unknown = sorted(set(forward.unknown + backward.unknown))
    reason = f"unknown wrapper line kinds {unknown}" if unknown else ""
    return StepAccount(peak, where, not unknown, reason, handoff, bwd_peak, fwd_peak, output_bytes)
