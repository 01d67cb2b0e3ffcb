"""Distributed training as remat sees it: DDP's bucketed compiles and FSDP2's parameter groups.

Whether dynamo's DDP optimizer is compiling one bucket's piece of a split graph, which modules
are being called (so that a compile finds the DDP or FSDP2 module it runs under), and each
FSDP2 parameter group's shard and unsharded sizes, read from FSDP's private state. The
package's ``__init__`` re-exports these: remat calls ``adapter.fsdp2_groups`` and the like.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import torch
import torch.fx as fx


def compiling_ddp_bucket() -> bool:
    """Whether the backend is being called by dynamo's DDP optimizer for one bucket's piece of a
    graph it split in several (from its ``compile_submod``; no flag says so; one bucket is not split)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "compile_submod" and frame.f_code.co_filename.endswith(
                os.path.join("backends", "distributed.py")):
            return True
        frame = frame.f_back
    return False


def modules_being_called() -> list[torch.nn.Module]:
    """The modules whose calls are on the stack, innermost first (a compiled module as the
    module it wraps): while dynamo compiles a frame, the first is the module it compiles."""
    from torch._dynamo.eval_frame import OptimizedModule

    found: list[torch.nn.Module] = []
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_locals.get("self")
        if isinstance(module, OptimizedModule):
            module = module._orig_mod
        if isinstance(module, torch.nn.Module) and not isinstance(module, fx.GraphModule) \
                and all(module is not m for m in found):
            found.append(module)
        frame = frame.f_back
    return found


@dataclasses.dataclass(frozen=True)
class FsdpGroup:
    """One FSDP2 parameter group's sizes on this rank, in bytes."""

    modules: tuple[torch.nn.Module, ...]
    shard_bytes: int  # local (padded) shards of its parameters
    grad_shard_bytes: int  # local gradient shards of its trainable parameters
    unsharded_bytes: int  # its all-gather output: every rank's shard, in the parameter dtype
    unsharded_grad_bytes: int  # its reduce-scatter input, in the reduce dtype
    reshards_after_forward: bool


def is_fsdp2_module(module: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(module, FSDPModule)


def is_ddp_module(module: torch.nn.Module) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(module, DistributedDataParallel)


def fsdp2_groups(module: torch.nn.Module) -> list[FsdpGroup] | None:
    """Every FSDP2 parameter group of the model ``module`` is part of (after FSDP's lazy init,
    which its root's first forward runs), from FSDP's own state; None when that state is not
    readable (not initialized yet, or a torch that moved it)."""
    try:
        states = module._get_fsdp_state()._state_ctx.all_states
        groups = [state._fsdp_param_group for state in states]
        return [_fsdp_group(g) for g in groups if g is not None] or None
    except (AttributeError, TypeError):
        return None


def _fsdp_group(group: Any) -> FsdpGroup:
    shards = grads = unsharded = unsharded_grads = 0
    for param in group.fsdp_params:
        local = param._sharded_param_data.numel()
        world = group.mesh_info.shard_mesh_size
        shards += local * param.orig_dtype.itemsize
        unsharded += local * world * (param.param_dtype or param.orig_dtype).itemsize
        if param.sharded_param.requires_grad:
            grads += local * param.orig_dtype.itemsize
            unsharded_grads += local * world * (param.reduce_dtype or param.param_dtype or param.orig_dtype).itemsize
    return FsdpGroup(tuple(group.modules), shards, grads, unsharded, unsharded_grads,
                     group.post_forward_mesh_info is not None)
