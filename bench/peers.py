"""PyTorch's own memory options, each a peer that remat is measured against.

A peer turns a model into the callable one training step runs (``loss =
run(*inputs); loss.backward()``), inside a context that holds whatever it
changed (checkpoint wrappers on the model's blocks, torch's partitioner
config) until the peer's rows are measured.

>>> [p.name for p in PEERS][:3]
['eager store-all', 'eager checkpoint per block', 'compile default']
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from remat.passes import torch_adapter as adapter
from remat.passes.capture.taxonomy import saved_by_selective

Run = Callable[..., torch.Tensor]
BUDGET_FRACTIONS = (0.8, 0.5, 0.2, 0.0)

def torch_memory_budget(budget: float, solver: str = "dp") -> contextlib.AbstractContextManager[None]:
    """``torch.compile``'s own memory-budget partitioner: ``budget`` is torch's fraction (1.0 = its
    min-cut default, 0.0 = recompute all it can); ``solver`` one of torch's ("dp", "greedy", "ilp")."""
    return adapter.functorch_settings(activation_memory_budget=budget, activation_memory_budget_solver=solver)


def torch_budget_solvers() -> list[str]:
    """torch's memory-budget solvers usable here (its ILP needs scipy)."""
    import importlib.util

    return ["dp", "greedy"] + (["ilp"] if importlib.util.find_spec("scipy") else [])


def blocks_of(model: nn.Module) -> nn.ModuleList | nn.Sequential:
    """The model's repeated blocks: ``model.blocks`` (every zoo model, and the HF wrappers)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise ValueError(f"{type(model).__name__} has no .blocks list to checkpoint")
    return blocks


def save_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Selective-checkpoint policy: save matmul-class outputs, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if saved_by_selective(op) else CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """``block`` run under ``torch.utils.checkpoint`` (non-reentrant), optionally selective."""

    def __init__(self, block: nn.Module, selective: bool = False) -> None:
        super().__init__()
        self.block = block
        self.selective = selective

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        extra = {"context_fn": functools.partial(create_selective_checkpoint_contexts, save_matmuls)}
        return checkpoint(self.block, *args, use_reentrant=False, **(extra if self.selective else {}), **kwargs)


@contextlib.contextmanager
def checkpointed_blocks(model: nn.Module, *, selective: bool = False) -> Iterator[None]:
    """Wrap every block of ``model`` in :class:`Checkpointed` for the block; restore after."""
    blocks = blocks_of(model)
    originals = list(blocks)
    try:
        for i, block in enumerate(originals):
            blocks[i] = Checkpointed(block, selective)
        yield
    finally:
        for i, block in enumerate(originals):
            blocks[i] = block


@dataclass(frozen=True)
class Peer:
    """One of PyTorch's options: how it compiles (or not) and what it changes meanwhile."""

    name: str
    compiled: bool
    checkpoint: str = ""  # "", "block" or "selective"
    budget: float | None = None  # torch's activation_memory_budget
    budget_solver: str = ""

    @contextlib.contextmanager
    def prepare(self, model: nn.Module, backend: str) -> Iterator[Run]:
        """Yield the step's callable with this peer's changes in force."""
        with contextlib.ExitStack() as stack:
            if self.checkpoint:
                stack.enter_context(checkpointed_blocks(model, selective=self.checkpoint == "selective"))
            if self.budget is not None:
                stack.enter_context(torch_memory_budget(self.budget, self.budget_solver))
            adapter.reset_compiled()
            yield torch.compile(model, backend=backend) if self.compiled else model
            adapter.reset_compiled()


def all_peers() -> list[Peer]:
    """Every peer the issue names, torch's ILP budget solver only where scipy is installed."""
    peers = [Peer("eager store-all", False), Peer("eager checkpoint per block", False, "block"),
             Peer("compile default", True)]
    solvers = ["dp"] + [s for s in torch_budget_solvers() if s == "ilp"]
    peers += [Peer(f"compile budget {f} ({s})", True, budget=f, budget_solver=s)
              for s in solvers for f in BUDGET_FRACTIONS]
    peers += [Peer("compile checkpoint per block", True, "block"),
              Peer("compile selective checkpoint (save matmuls)", True, "selective")]
    return peers


PEERS = all_peers()


def select(names: list[str] | None) -> list[Peer]:
    """Peers whose name contains any of ``names`` (all when ``names`` is empty)."""
    if not names:
        return list(PEERS)
    chosen = [p for p in PEERS if any(n in p.name for n in names)]
    if not chosen:
        raise ValueError(f"no peer matches {names}; peers: {[p.name for p in PEERS]}")
    return chosen
