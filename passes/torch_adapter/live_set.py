"""Where each buffer of Inductor's generated program came from (for ``bench/peak_diff.py``).

Part of the adapter: it reads ``GraphLowering`` internals (``name_to_buffer``, each IR
buffer's ``origin_node`` and ``origins``), which ``inductor_account`` does not need: the
account counts bytes by buffer name, and a peak diff must also say which FX node made each
buffer. Call :func:`buffer_origins` from an ``on_inductor_codegen`` callback, when the
program is final.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.fx as fx

from .inductor_program import _PARTITIONED_OUTPUTS, _layout_bytes

__all__ = ["buffer_bytes", "buffer_origins", "is_backward", "partitioned_outputs_kept"]


def is_backward(lowering: Any) -> bool:
    """Whether the lowered graph is a backward (Inductor is told so by AOTAutograd)."""
    return bool(getattr(lowering, "is_backward", False))


def buffer_origins(lowering: Any) -> dict[str, list[fx.Node]]:
    """Buffer name -> the FX nodes it was made from, the node whose value it holds first.

    A fused kernel's buffer lists every node inlined into it (``origins``); the value it holds
    is ``origin_node`` where Inductor recorded one, else the latest of its origins in graph
    order (the others are the pointwise ops fused into it). A buffer with no origin (rare:
    a layout copy) maps to an empty list."""
    order = {node: i for i, node in enumerate(getattr(getattr(lowering, "module", None), "graph", fx.Graph()).nodes)}
    out: dict[str, list[fx.Node]] = {}
    for name, buffer in getattr(lowering, "name_to_buffer", {}).items():
        origins = sorted((o for o in getattr(buffer, "origins", ()) or () if isinstance(o, fx.Node)),
                         key=lambda n: order.get(n, -1), reverse=True)
        main = getattr(buffer, "origin_node", None)
        if isinstance(main, fx.Node):
            origins = [main] + [o for o in origins if o is not main]
        out[name] = origins
    return out


def buffer_bytes(lowering: Any) -> dict[str, int]:
    """Buffer name -> the bytes its layout spans (those whose size is known). A peak diff needs it
    where the wrapper names a buffer it never allocates: an element of a nested tuple an extern
    kernel returns (``run_and_save_rng_state``'s ``buf12[1][0]``), read through a ``MultiOutput``."""
    out = {}
    for name, buffer in getattr(lowering, "name_to_buffer", {}).items():
        try:
            out[name] = _layout_bytes(lowering, buffer)
        except Exception:  # noqa: BLE001 - no layout, or a symbolic size: not a tensor this needs
            continue
    return out


@contextlib.contextmanager
def partitioned_outputs_kept() -> Iterator[None]:
    """Read a program (``inductor_account.walk``) without using up the output names remat's own
    reading of the same program will take: ``fx_output_names`` pops them, one entry per program, so
    a second reader inside remat's compile would shift remat's. The list is restored as it was."""
    saved = list(_PARTITIONED_OUTPUTS)
    try:
        yield
    finally:
        _PARTITIONED_OUTPUTS[:] = saved
