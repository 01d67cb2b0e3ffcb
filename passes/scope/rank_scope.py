"""The step's budget: what a rank (or a single process) holds outside one compiled graph.

Every graph's scope is built one way (:func:`scope_of`): what holds memory around it, a rank's
wrapper (:func:`wrapper_scope`) or the single process's step (:func:`process_scope`), then what every
step counts alike (:func:`step_scope`): what torch's tracing keeps alive for the graph
(:func:`traced_storages`) and the eager code after it, as measured after this graph on an earlier
step of this process (``step.STEP``), else reserved (:func:`reserved_eager_bytes`) until the
graph's first step measures it (``passes/scope/eager_parts.py``).

Under FSDP2 or DDP a compiled graph is one part of a rank's training step. While the last of
L identical blocks runs its backward, the other L-1 blocks still hold their kept activations
and their inputs, FSDP holds every local shard, the unsharded parameters of groups it does not
reshard after forward (the root's), the next block's prefetched all-gather and a reduce-scatter
input; DDP holds its gradient buckets. A :class:`RankScope` counts those bytes from FSDP2's own
state and the module tree, and the problem carries them (``Problem.outside``, named parts,
and ``Problem.kept_copies``), so every memory row of the program is the rank's, and so is the
predicted peak. The eager code between compiled graphs (an FSDP2 model's embedding, head and loss
when only its blocks are compiled) is reserved, measured on the first step and counted from then on
(``eager_bytes``). Not counted: optimizer state (as on one GPU).

In a single process (no FSDP2 or DDP around the graph) the scope is the process's step
(``wrapper`` "process"): the whole model's state the graph does not read is resident, other calls of
a block count as copies, the step's open graphs (``Step.held_beside``) beside it, and the eager code
after the graph (a loss computed outside the model, graph-break code and later graphs) is reserved
before the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from remat.solvers.problem import Part, Problem

from .. import torch_adapter as adapter
from .eager_window import EagerParts
from .step import STEP

@dataclass(frozen=True)
class RankScope:
    """The rank's memory outside one graph, in bytes.

    - ``wrapper``: "FSDP2" or "DDP", what the sizes were read from;
    - ``copies``: other modules like the one compiled (same class, same parameter shapes) whose
      kept values and inputs stay alive through its step;
    - ``resident_bytes``: local parameter and gradient shards, unsharded parameters FSDP keeps
      between forward and backward (other than this graph's own), DDP's gradient buckets;
    - ``comm_bytes``: FSDP's prefetched all-gather output and one reduce-scatter input;
    - ``copy_input_bytes``: the copies' activation inputs, which their backwards read;
    - ``eager_bytes``: what the eager code between the graph's last forward and its first
      backward (a model's head and loss) allocates above what it found, measured on the first
      step (``passes/scope/eager_parts.py``); until then 0 under FSDP2 and DDP, and a reservation in a
      single process (``eager_reserved``);
    - ``eager_after_bytes``: what that eager code leaves alive through the backward besides the
      outputs' gradients (the loss, a head's outputs the caller keeps), counted at every step;
    - ``graphs_bytes``: what other graphs of the step hold while this one runs: those whose forward
      had returned, and whose backward had not begun, when this one was compiled (graph breaks,
      separately compiled modules: an encoder's kept activations while its head runs);
    - ``other_state_bytes``: parameters and buffers of other graphs that ran between this graph's
      forward and its backward on the first step, which its own module does not hold (a head
      compiled apart from its encoder), held through the step as the model's state;
    - ``eager_freed_bytes``: what that eager code freed of what the graph had left (the logits a loss
      outside the model drops), not held through the backward then.
    """

    wrapper: str
    copies: int = 0
    resident_bytes: int = 0
    comm_bytes: int = 0
    copy_input_bytes: int = 0
    eager_bytes: int = 0
    eager_after_bytes: int = 0
    eager_reserved: bool = False
    graphs_bytes: int = 0
    other_state_bytes: int = 0
    eager_freed_bytes: int = 0
    graph: str = ""  # the compiled graph's fingerprint, under which a measured window is remembered
    traced_bytes: int = 0  # of resident_bytes: what torch's tracing keeps for the graph (traced_storages)
    input_bytes: int = 0  # the graph's activation inputs per call (a copy's, in copy_input_bytes)

    @property
    def process(self) -> bool:
        """The step of a single process, not a rank of FSDP2 or DDP."""
        return self.wrapper == PROCESS

    @property
    def outside_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.outside_parts())

    def with_eager(self, eager: EagerParts) -> RankScope:
        """This scope counting a measured eager window; in a single process also the forward calls that
        step made before its backward (a block called per layer)."""
        scope = replace(self, eager_bytes=eager.peak, eager_after_bytes=eager.after, eager_reserved=False,
                        other_state_bytes=eager.other_state, eager_freed_bytes=eager.freed)
        if eager.copies is None or not self.process or eager.copies == self.copies:
            return scope
        return replace(scope, copies=eager.copies, copy_input_bytes=eager.copies * self.input_bytes)

    def outside_parts(self) -> tuple[Part, ...]:
        """The memory outside the graph at every step, each part named as a report says it."""
        resident = ("the model's state the graph does not read, and what tracing keeps for it" if self.process
                    else f"{self.wrapper}'s parameter and gradient shards, unsharded parameters, buckets")
        named = ((resident, self.resident_bytes), (f"{self.wrapper}'s communication buffers", self.comm_bytes),
                 ("the inputs of other calls of this block", self.copy_input_bytes),
                 ("what the eager code after the graph keeps through the backward (a loss)", self.eager_after_bytes),
                 ("other graphs of the step, between their forward and backward", self.graphs_bytes),
                 ("the state of other graphs run between forward and backward", self.other_state_bytes))
        return tuple((what, nbytes) for what, nbytes in named if nbytes)

    def applied(self, problem: Problem) -> Problem:
        # the eager bytes live between the graph's forward and its backward only: one memory row (what
        # they leave through the backward is outside the graph, alive at every row, that row included)
        handoff = max(0, self.eager_bytes - self.eager_after_bytes)
        what = "the eager code between forward and backward (a head or loss outside the graph)" + (
            ", reserved until measured" if self.eager_reserved else "")
        return replace(problem, outside=self.outside_parts(), kept_copies=self.copies,
                       handoff=((what, handoff),) if handoff else ())

    def key(self) -> dict[str, Any]:
        """What the plan cache keys on: a plan made for other outside memory is another plan. A process's
        eager figures are left out: its first step measures them again and plans again where they changed
        (a plan stored before them, loaded after, is then counted anew)."""
        measured = {"graph", "eager_bytes", "eager_after_bytes", "eager_reserved", "other_state_bytes",
                    "eager_freed_bytes"}
        return {name: value for name, value in asdict(self).items() if not (self.process and name in measured)
                and name != "graph"}


PROCESS = "process"


def scope_of(gm: fx.GraphModule, example_inputs: Sequence[Any], budget_scope: str) -> RankScope | None:
    """The step scope of the graph dynamo is compiling now: a rank's under FSDP2 or DDP, else the
    process's; None for ``budget_scope`` "graph"."""
    if budget_scope == "graph":
        return None
    modules = adapter.modules_being_called()
    if not any(adapter.is_fsdp2_module(m) or adapter.is_ddp_module(m) for m in modules):
        return step_scope(gm, example_inputs, process_scope(gm, example_inputs, modules), modules)
    wrapper = wrapper_scope(gm, example_inputs, modules)
    return None if wrapper is None else step_scope(gm, example_inputs, wrapper, modules)


def step_scope(gm: fx.GraphModule, example_inputs: Sequence[Any], scope: RankScope,
               modules: list[torch.nn.Module]) -> RankScope:
    """``scope`` with what every step counts alike, a rank's or a single process's: what torch's tracing
    keeps alive for the graph, and the eager code after it as measured after this graph on an earlier
    step of this process (the step object's), else reserved until the graph's first step measures it
    (after a block compiled one by one, the model's head and loss: the block's outputs as wide as the
    head makes them). ``modules``: those being called, innermost first."""
    from ..cache.plan_cache import graph_fingerprint

    graph = graph_fingerprint(gm.graph, by_position=True)
    traced = sum(traced_storages(gm, example_inputs).values())
    scope = replace(scope, resident_bytes=scope.resident_bytes + traced, traced_bytes=traced, graph=graph)
    measured = STEP.eager_after(graph)
    if measured is not None:
        return scope.with_eager(measured)
    widening = head_widening(modules[0], modules[-1]) if modules else 1.0
    return replace(scope, eager_bytes=reserved_eager_bytes(gm, widening), eager_reserved=True)


def process_scope(gm: fx.GraphModule, example_inputs: Sequence[Any], modules: list[torch.nn.Module]) -> RankScope:
    """A single process's step before what :func:`step_scope` adds: the whole model's state the graph
    does not read, the other calls of a module built like others (a block) and the open graphs."""
    # the whole model the step runs holds its state, also what other graphs or eager code read
    resident = unread_state_bytes(example_inputs, outermost=True)
    # a module built like others of the model (a block) is called once for each: their kept values add up
    copies = copies_of(modules[0], modules[-1]) if modules else 0
    inputs = activation_input_bytes(gm, example_inputs)
    return RankScope(PROCESS, copies=copies, resident_bytes=resident, copy_input_bytes=copies * inputs,
                     input_bytes=inputs, graphs_bytes=open_graphs_bytes(gm, example_inputs))


def wrapper_scope(gm: fx.GraphModule, example_inputs: Sequence[Any], modules: list[torch.nn.Module]) -> RankScope | None:
    """A rank's memory outside the graph under FSDP2 (read from its groups) or DDP (its buckets); None
    where FSDP2's groups cannot be read and no DDP is around."""
    fsdp = [m for m in modules if adapter.is_fsdp2_module(m)]
    ddp = [m for m in modules if adapter.is_ddp_module(m)]
    compiled, params, inputs = modules[0], parameter_bytes(example_inputs), activation_input_bytes(gm, example_inputs)
    groups = adapter.fsdp2_groups(fsdp[0]) if fsdp else None
    if groups is not None:
        return fsdp2_scope(groups, fsdp[0], fsdp[-1], compiled, params, inputs)
    return ddp_scope(ddp[-1], compiled, inputs) if ddp else None


def traced_storages(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[tuple, int]:
    """What Dynamo's tracing of ``gm`` keeps alive on the graph's devices for the graph's life, by storage
    (``adapter.traced_real_tensors``: 8 bytes on the CPU per Python number an op multiplied or divided
    by), allocated on the step that compiles it: held through every step as the model's state is."""
    devices = {t.device for t in example_inputs if isinstance(t, torch.Tensor)}
    if all(device.type != "cpu" for device in devices):  # (what autograd saves of a number is on the CPU)
        return {}
    return storages_of([t for t in adapter.traced_real_tensors(gm) if t.device in devices])


def reserved_eager_bytes(gm: fx.GraphModule, widening: float = 1.0) -> int:
    """What the step's first run counts for the eager code after the graph, before measuring it: three
    times the bytes of the graph's outputs that a backward will reach (a cross-entropy loss holds the
    log-softmax of its input, then its gradient and the input's gradient at once), ``widening`` times
    wider where the model's code after the graph widens them (:func:`head_widening`); 0 for scalar
    outputs (a loss inside the model)."""
    (output,) = gm.graph.find_nodes(op="output")
    values = [node.meta.get("example_value") for node in output.all_input_nodes]
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]
    numels = [int(adapter.size_hint(v.numel())) for v in tensors]
    nbytes = sum(n * v.element_size() for n, v in zip(numels, tensors) if n > 1)  # (not a scalar loss)
    return int(3 * widening * nbytes)


def head_widening(compiled: torch.nn.Module, root: torch.nn.Module) -> float:
    """How much wider than the compiled module's outputs the model's code after it can make them, read
    from the module tree: the largest ratio of a linear layer's output to its input features among the
    layers of ``root`` outside every module built like ``compiled`` (a language model's head over the
    blocks compiled one by one: its vocabulary over its width); 1 where there is none, or where the
    compiled module is the whole model."""
    if compiled is root:
        return 1.0
    inside = {id(inner) for block in modules_alike(compiled, root) for inner in block.modules()}
    ratios = [m.out_features / m.in_features for m in root.modules()
              if isinstance(m, torch.nn.Linear) and id(m) not in inside and m.in_features]
    return max([1.0, *ratios])


def open_graphs_bytes(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> int:
    """What the step's open graphs hold beside ``gm`` compiled now (:meth:`Step.held_beside`)."""
    taken = {_storage_of(t)[0] for t in example_inputs if isinstance(t, torch.Tensor)}
    return STEP.held_beside(taken, state_storages(gm, example_inputs))


def state_storages(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[tuple, int]:
    """What a graph's step holds as state, by storage: the parameters and buffers among its inputs and
    those of the outermost module being called (``unread_state_bytes``'s), and what torch's tracing of
    the graph keeps alive (:func:`traced_storages`)."""
    modules = adapter.modules_being_called()
    own = [t for t in example_inputs if isinstance(t, torch.nn.Parameter)]
    held = [*modules[-1].parameters(), *modules[-1].buffers()] if modules else []
    return {**dict(_storage_of(t) for t in [*own, *held]), **traced_storages(gm, example_inputs)}


def unread_state_bytes(example_inputs: Sequence[Any], *, outermost: bool = False) -> int:
    """Bytes of the compiled module's parameters and buffers that the graph does not take as
    inputs (an unused buffer, a part another graph reads): held through the step, as the budget
    counts the model's state, though no line of the graph's program allocates or reads them.
    Each storage once; 0 when no module is being compiled (a function). ``outermost``: of the
    outermost module being called (the whole model of the step) instead of the innermost."""
    modules = adapter.modules_being_called()
    if not modules:
        return 0
    module = modules[-1] if outermost else modules[0]
    read = {_storage_of(t)[0] for t in example_inputs if isinstance(t, torch.Tensor)}
    state = dict(_storage_of(t) for t in [*module.parameters(), *module.buffers()])
    return sum(nbytes for key, nbytes in state.items() if key not in read)


def storages_of(tensors: Sequence[Any]) -> dict[tuple, int]:
    """The storages behind ``tensors``, each once, by what identifies it."""
    return dict(_storage_of(t) for t in tensors if isinstance(t, torch.Tensor))


def _storage_of(t: torch.Tensor) -> tuple[tuple, int]:
    """(what identifies ``t``'s storage, its bytes); a tensor without a plain storage of its own
    (meta, fake, a subclass such as DTensor) counts 0 bytes."""
    try:
        storage = t.untyped_storage()
        return (t.device.type, t.device.index, storage.data_ptr()), (0 if t.device.type == "meta" else storage.nbytes())
    except (RuntimeError, NotImplementedError, TypeError):
        return ("id", id(t)), 0


def fsdp2_scope(groups: list[adapter.FsdpGroup], own_module: torch.nn.Module, root: torch.nn.Module,
                compiled: torch.nn.Module, graph_params: int, inputs: int) -> RankScope:
    """FSDP2: ``own_module`` is the innermost FSDP module around the graph, whose group's
    unsharded parameters are the graph's own inputs while it runs; ``root`` the outermost."""
    own = next((g for g in groups if any(m is own_module for m in g.modules)), None)
    resident = sum(g.shard_bytes + g.grad_shard_bytes for g in groups)
    kept_unsharded = [g for g in groups if not g.reshards_after_forward]
    resident += sum(g.unsharded_bytes for g in kept_unsharded if g is not own)
    if own is not None and not own.reshards_after_forward:  # the graph's parameters are counted as its inputs
        resident += max(0, own.unsharded_bytes - graph_params)
    prefetch = max((g.unsharded_bytes for g in groups if g.reshards_after_forward and g is not own), default=0)
    reduce_scatter = max((g.unsharded_grad_bytes for g in groups), default=0)
    copies = copies_of(compiled, root)
    return RankScope("FSDP2", copies, resident, prefetch + reduce_scatter, copies * inputs, input_bytes=inputs)


def ddp_scope(ddp: torch.nn.Module, compiled: torch.nn.Module, inputs: int) -> RankScope:
    """DDP: the reducer's buckets hold a copy of every trainable parameter's gradient."""
    buckets = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)
    copies = copies_of(compiled, ddp.module)
    return RankScope("DDP", copies, buckets, 0, copies * inputs, input_bytes=inputs)


def copies_of(compiled: torch.nn.Module, root: torch.nn.Module) -> int:
    """Other modules in ``root`` built like ``compiled`` (its class and parameter shapes): one
    compiled graph stands for each of them, and each holds its own kept values."""
    if compiled is root:
        return 0
    return max(0, len(modules_alike(compiled, root)) - 1)


def modules_alike(compiled: torch.nn.Module, root: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``root`` built like ``compiled`` (its class and parameter shapes), itself included."""
    shapes = _parameter_shapes(compiled)
    return [m for m in root.modules() if type(m) is type(compiled) and _parameter_shapes(m) == shapes]


def _parameter_shapes(module: torch.nn.Module) -> tuple:
    return tuple((name, tuple(p.shape)) for name, p in module.named_parameters())


def parameter_bytes(example_inputs: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in example_inputs if isinstance(t, torch.nn.Parameter))


def activation_input_bytes(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> int:
    """Bytes of the graph's inputs that are neither parameters nor buffers: activations another
    part of the model handed it (a block's input), which its backward holds."""
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    total = 0
    for name, t in zip(names, example_inputs):
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and "_buffers_" not in name:
            total += t.numel() * t.element_size()
    return total
