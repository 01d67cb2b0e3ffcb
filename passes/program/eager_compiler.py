"""The "eager" compiler: partition like Inductor, then run both graphs op by op.

No fusion: every intermediate is materialized, which is exactly what the memory
model assumes. Used for debugging and for exact memory checks
(``compiler="eager"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .. import torch_adapter as adapter
from ..torch_adapter import GraphHook


def traced_layout(value: Any, traced: Any) -> Any:
    """``value`` with the strides it was traced with (a copy where the kernel chose others)."""
    if isinstance(value, (tuple, list)) and isinstance(traced, (tuple, list)) and len(value) == len(traced):
        return type(value)(traced_layout(v, t) for v, t in zip(value, traced))
    if not (isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor)) or value.dim() < 2:
        return value
    if any(isinstance(s, torch.SymInt) for s in (*traced.shape, *traced.stride())):
        return value
    stride = tuple(traced.stride())
    if tuple(value.stride()) == stride or tuple(value.shape) != tuple(traced.shape) or value._base is not None:
        return value
    return torch.empty_strided(value.shape, stride, dtype=value.dtype, device=value.device).copy_(value)


class TracedLayoutInterpreter(fx.Interpreter):
    """Runs a graph op by op, keeping every output in the layout it was traced with.

    Some CPU kernels (batch norm, layer norm's backward) return contiguous
    outputs where their fake kernels keep the input's strides; a ``view``
    traced on the fake layout then fails on the real one (torch's own
    ``aot_eager`` backend fails the same way).
    """

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        return traced_layout(result, n.meta.get("val")) if n.op == "call_function" else result


def compile_eager(
    gm: fx.GraphModule, example_inputs: Sequence[Any], *, on_graph: GraphHook
) -> Callable[..., Any]:
    """Decompose and partition like Inductor would, then run both graphs op by op.

    No fusion: every intermediate is materialized, which is exactly what the
    memory model assumes. Used for debugging and for exact memory checks.
    Inductor's decompositions also replace aten kernels whose real strides
    differ from their fake ones (CPU batch norm); like Inductor's, they draw
    dropout masks with aten's random ops only under ``fallback_random``.
    """

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_graph(graph: fx.GraphModule, _inputs: Sequence[Any]) -> Any:
            on_graph(graph, kind)

            def run(args: list[Any]) -> Any:
                # boxed: the argument list is cleared and every value freed after
                # its last use, as Inductor's code does
                return TracedLayoutInterpreter(graph, garbage_collect_values=True).boxed_run(args)

            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        return compile_graph

    return adapter.aot_min_cut_backend(compiler("forward"), compiler("backward"))(gm, example_inputs)
