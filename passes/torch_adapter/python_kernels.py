"""The scratch of ops whose eager kernel is Python, counted without running anything.

Part of the adapter: ``torch._library.custom_ops`` (where ``torch.library.custom_op`` keeps an op's
Python implementation) and ``torch.utils._python_dispatch``.

Some ops the joint graph holds run in eager as a Python function over other ops: Inductor's prims
(``prims.fma``, which its decomposition of softmax's backward emits, is ``(a * b) + c``: a
temporary as large as its output) and any ``torch.library.custom_op`` a user writes. A measured
profile sees their temporaries on the device; an analytic one (a model on the meta device) did
not, and its smallest feasible budget came out below the device's. :func:`python_kernel_scratch`
runs the Python function on meta tensors and counts what its ops allocate above its outputs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def python_kernel(op: Any) -> Callable[..., Any] | None:
    """The Python function ``op`` runs in eager, where it was made by ``torch.library.custom_op``
    (Inductor's prims are); None for every other op."""
    from torch._library import custom_ops

    if not isinstance(op, torch._ops.OpOverload):
        return None
    made = custom_ops.OPDEFS.get(op._schema.name)
    return None if made is None else made._init_fn


class _LiveBytes(TorchDispatchMode):
    """Bytes of the tensors the ops under it create, alive now and at most: an output that aliases
    an input (a view, an in-place op) adds none, and each counts until Python frees it."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        for index, value in enumerate(out if isinstance(out, (tuple, list)) else [out]):
            aliases = index < len(returns) and returns[index].alias_info is not None
            if isinstance(value, torch.Tensor) and not aliases:
                nbytes = value.untyped_storage().nbytes()
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(value, self._freed, nbytes)
        return out

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


def python_kernel_scratch(op: Any, args: tuple, kwargs: dict) -> int | None:
    """Bytes ``op``'s Python kernel holds above its outputs at its peak, run on ``args`` (meta
    tensors: nothing is allocated); None where ``op`` has no Python kernel or it cannot run on meta."""
    kernel = python_kernel(op)
    if kernel is None:
        return None
    counter = _LiveBytes()
    try:
        with counter:
            out = kernel(*args, **kwargs)
    except Exception:  # a kernel that needs real values (.item(), a library call): unknown
        return None
    kept = sum(t.untyped_storage().nbytes() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    return max(0, counter.peak - kept)
