"""Capturing a model on the meta device as it would be captured on the device planned for.

Two things in torch make a meta capture differ from a real device's:

- ``torch._meta_registrations`` gives ~100 ops that have a CompositeImplicitAutograd kernel
  (``nll_loss``, ``dropout``, ``broadcast_tensors``, ``silu_backward``...) a Python kernel for the Meta key.
  Under the Python dispatcher, which AOTAutograd traces with, a backend kernel hides the
  composite one from the AutogradMeta key, so the op runs below autograd: its output does not
  require grad and the joint graph loses its whole backward (a 2-layer Llama captured 23 of
  496 nodes, with no error). :func:`composites_decompose` hides those Python kernels while a
  meta graph is traced, so the ops decompose before autograd, as on every other device.
- ``scaled_dot_product_attention`` picks its kernel by device type, and a meta tensor always
  gets the math kernel, which holds the (T, T) attention matrix a fused kernel never
  materializes. :func:`fused_attention` makes the choice the device planned for would make.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch._C import DispatchKey
from torch.fx.node import map_aggregate

SDPA = torch.ops.aten.scaled_dot_product_attention.default
MATH, FLASH, EFFICIENT = 0, 1, 2  # torch's SDPBackend values, as _fused_sdp_choice returns them


def is_meta(values: Any) -> bool:
    """Whether any tensor among ``values`` (nested lists, tuples, dicts) lives on the meta device."""
    from torch.utils._pytree import tree_leaves

    return any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in tree_leaves(values))


def composite_ops_with_meta_kernels() -> list[torch._ops.OpOverload]:
    """ATen ops with a CompositeImplicitAutograd kernel that torch's Python code also gave a Meta
    kernel (``torch._meta_registrations``, ``torch._refs``). Only an overload already made can
    hold a Python kernel, and each is cached on its packet, which is cached on ``torch.ops.aten``."""
    found = []
    for packet in list(vars(torch.ops.aten).values()):
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for op in list(vars(packet).values()):
            if isinstance(op, torch._ops.OpOverload) and DispatchKey.Meta in op.py_kernels \
                    and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
                found.append(op)
    return found


@contextlib.contextmanager
def composites_decompose() -> Iterator[None]:
    """Composite ops decompose above autograd on meta tensors in the block (see the module's note)."""
    hidden = [(op, op.py_kernels.pop(DispatchKey.Meta)) for op in composite_ops_with_meta_kernels()]
    for op, _ in hidden:
        op._uncache_dispatch(DispatchKey.Meta)
        op._uncache_dispatch(DispatchKey.AutogradMeta)
    try:
        yield
    finally:
        for op, kernel in hidden:
            op.py_kernels[DispatchKey.Meta] = kernel
            op._uncache_dispatch(DispatchKey.Meta)
            op._uncache_dispatch(DispatchKey.AutogradMeta)


def cpu_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> int:
    """The kernel torch picks on this machine's CPU for these shapes: its own check, run on real
    tensors that share one row of storage (the check reads shapes, strides and dtypes only)."""
    from torch.utils._python_dispatch import _disable_current_modes

    def stand_in(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        strides = [0] * (t.dim() - 1) + [int(t.stride(-1))]
        span = 1 + (int(t.shape[-1]) - 1) * strides[-1]
        return torch.empty(span, dtype=t.dtype).as_strided([int(s) for s in t.shape], strides) \
            .requires_grad_(t.requires_grad and t.dtype.is_floating_point)

    with _disable_current_modes():
        return int(torch._fused_sdp_choice(stand_in(q), stand_in(k), stand_in(v), stand_in(mask), dropout_p,
                                           is_causal, scale=scale, enable_gqa=enable_gqa))


def cuda_choice(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, enable_gqa: bool) -> int:
    """The kernel torch picks on a recent NVIDIA GPU, from its main constraints: flash attention
    for 16-bit inputs without a mask and a head dimension a multiple of 8 up to 256 (it takes
    grouped-query heads); memory-efficient attention otherwise, up to a head dimension of 512 with
    as many key as query heads. (On Hopper torch may prefer cuDNN attention, which saves what
    flash saves: the output and its log-sum-exp.)"""
    head_dim = int(q.shape[-1])
    grouped = enable_gqa and int(q.shape[-3]) != int(k.shape[-3])
    if q.dtype in (torch.float16, torch.bfloat16) and mask is None and head_dim % 8 == 0 and head_dim <= 256:
        return FLASH
    return EFFICIENT if head_dim % 8 == 0 and head_dim <= 512 and not grouped else MATH


def fused_attention(kind: str) -> Any:
    """A kernel for ``scaled_dot_product_attention`` on meta tensors that calls what a ``kind``
    ("cpu" or "cuda") device would call."""

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:
        aten = torch.ops.aten
        if q.dim() != 4:
            return SDPA.decompose(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if kind == "cpu":
            choice = cpu_choice(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            if choice == FLASH:
                return aten._scaled_dot_product_flash_attention_for_cpu.default(
                    q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        else:
            choice = cuda_choice(q, k, attn_mask, enable_gqa)
            if choice == FLASH:
                return aten._scaled_dot_product_flash_attention.default(q, k, v, dropout_p, is_causal,
                                                                         scale=scale)[0]
            if choice == EFFICIENT:
                grad = q.requires_grad or k.requires_grad or v.requires_grad
                return aten._scaled_dot_product_efficient_attention.default(
                    q, k, v, attn_mask, grad, dropout_p, is_causal, scale=scale)[0]
        return SDPA.decompose(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    return sdpa


@contextlib.contextmanager
def attention_as_on(kind: str) -> Iterator[None]:
    """``scaled_dot_product_attention`` on meta tensors picks ``kind``'s kernel in the block."""
    had = SDPA.py_kernels.get(DispatchKey.AutogradMeta)
    SDPA.py_kernels[DispatchKey.AutogradMeta] = fused_attention(kind)
    SDPA._uncache_dispatch(DispatchKey.AutogradMeta)
    try:
        yield
    finally:
        if had is None:
            SDPA.py_kernels.pop(DispatchKey.AutogradMeta, None)
        else:
            SDPA.py_kernels[DispatchKey.AutogradMeta] = had
        SDPA._uncache_dispatch(DispatchKey.AutogradMeta)


@contextlib.contextmanager
def captured_as_on(kind: str) -> Iterator[None]:
    """A meta graph traced in the block is the graph a ``kind`` device ("cpu" or "cuda") would give."""
    with composites_decompose(), attention_as_on(kind):
        yield


def on_fake_device(gm: torch.fx.GraphModule, example_inputs: list[Any],
                   kind: str) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``gm`` and its meta ``example_inputs`` as a ``kind`` device ("cpu") would give them to a
    backend, with nothing allocated: each input becomes a fake tensor on that device in dynamo's own
    fake mode (symbolic sizes kept), and each device the graph names (``torch.arange(...,
    device=x.device)`` is captured as a constant) becomes that device. Inductor then generates the
    device's program for the plan, which remat accounts for without running it."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode()
    if fake_mode is None:
        raise RuntimeError("remat: a meta graph was compiled outside dynamo's tracing; please report this")
    device = torch.device(kind)

    def moved(value: Any) -> Any:
        return device if isinstance(value, torch.device) and value.type == "meta" else value

    def fake(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.device.type != "meta":
            return value
        traced = fake_mode.from_tensor(value)  # dynamo's fake of this input: its (symbolic) sizes
        with fake_mode:
            out = torch.empty_strided(traced.shape, traced.stride(), dtype=traced.dtype, device=device)
        return out.requires_grad_(value.requires_grad)

    moved_gm = copy.deepcopy(gm)
    for node in moved_gm.graph.nodes:
        node.args, node.kwargs = map_aggregate(node.args, moved), map_aggregate(node.kwargs, moved)
    moved_gm.recompile()
    return moved_gm, [fake(v) for v in example_inputs]
