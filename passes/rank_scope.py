"""The per-rank budget (``budget_scope="rank"``): what a rank holds outside one compiled graph.

Under FSDP2 or DDP a compiled graph is one part of a rank's training step. While the last of
L identical blocks runs its backward, the other L-1 blocks still hold their kept activations
and their inputs, FSDP holds every local shard, the unsharded parameters of groups it does not
reshard after forward (the root's), the next block's prefetched all-gather and a reduce-scatter
input; DDP holds its gradient buckets. A :class:`RankScope` counts those bytes from FSDP2's own
state and the module tree (the eager parts are measured: below), and the problem carries them
(``Problem.outside_bytes``, ``Problem.kept_copies``), so every memory row of the program is the
rank's, and so is the predicted peak.

The eager code between compiled graphs (an FSDP2 model's embedding, head and loss when only its
blocks are compiled) is measured on the first step instead (``passes/eager_parts.py``) and
counted from then on (``eager_bytes``). Not counted: optimizer state (as on one GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from remat.solvers.problem import Problem

from . import torch_adapter as adapter

SCOPES = ("auto", "rank", "graph")


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
      step (``passes/eager_parts.py``); 0 until then.
    """

    wrapper: str
    copies: int = 0
    resident_bytes: int = 0
    comm_bytes: int = 0
    copy_input_bytes: int = 0
    eager_bytes: int = 0

    @property
    def outside_bytes(self) -> int:
        return self.resident_bytes + self.comm_bytes + self.copy_input_bytes

    def applied(self, problem: Problem) -> Problem:
        # the eager bytes live between the graph's forward and its backward only: one memory row
        return replace(problem, outside_bytes=self.outside_bytes, kept_copies=self.copies,
                       handoff_bytes=self.eager_bytes)

    def key(self) -> dict[str, Any]:
        """What the plan cache keys on: a plan made for other outside memory is another plan."""
        return asdict(self)


def scope_of(gm: fx.GraphModule, example_inputs: Sequence[Any], budget_scope: str) -> RankScope | None:
    """The rank scope of the graph dynamo is compiling now, or None: ``budget_scope`` "graph",
    or "auto" with no FSDP2 or DDP model around the graph."""
    if budget_scope == "graph":
        return None
    modules = adapter.modules_being_called()
    fsdp = [m for m in modules if adapter.is_fsdp2_module(m)]
    ddp = [m for m in modules if adapter.is_ddp_module(m)]
    if not modules or not (fsdp or ddp):
        return None
    compiled, params, inputs = modules[0], parameter_bytes(example_inputs), activation_input_bytes(gm, example_inputs)
    if fsdp:
        groups = adapter.fsdp2_groups(fsdp[0])
        if groups is not None:
            return fsdp2_scope(groups, fsdp[0], fsdp[-1], compiled, params, inputs)
    if ddp:
        return ddp_scope(ddp[-1], compiled, inputs)
    return None


def unread_state_bytes(example_inputs: Sequence[Any]) -> int:
    """Bytes of the compiled module's parameters and buffers that the graph does not take as
    inputs (an unused buffer, a part another graph reads): held through the step, as the budget
    counts the model's state, though no line of the graph's program allocates or reads them.
    Each storage once; 0 when no module is being compiled (a function)."""
    modules = adapter.modules_being_called()
    if not modules:
        return 0
    read = {_storage_of(t)[0] for t in example_inputs if isinstance(t, torch.Tensor)}
    state = dict(_storage_of(t) for t in [*modules[0].parameters(), *modules[0].buffers()])
    return sum(nbytes for key, nbytes in state.items() if key not in read)


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
    return RankScope("FSDP2", copies, resident, prefetch + reduce_scatter, copies * inputs)


def ddp_scope(ddp: torch.nn.Module, compiled: torch.nn.Module, inputs: int) -> RankScope:
    """DDP: the reducer's buckets hold a copy of every trainable parameter's gradient."""
    buckets = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)
    copies = copies_of(compiled, ddp.module)
    return RankScope("DDP", copies, buckets, 0, copies * inputs)


def copies_of(compiled: torch.nn.Module, root: torch.nn.Module) -> int:
    """Other modules in ``root`` built like ``compiled`` (its class and parameter shapes): one
    compiled graph stands for each of them, and each holds its own kept values."""
    if compiled is root:
        return 0
    shapes = _parameter_shapes(compiled)
    alike = [m for m in root.modules() if type(m) is type(compiled) and _parameter_shapes(m) == shapes]
    return max(0, len(alike) - 1)


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
