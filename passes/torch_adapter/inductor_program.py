"""Inductor's generated program, read line by line (for ``passes/program/inductor_account.py``).

Part of the adapter: the private names of ``torch._inductor``'s wrapper code generation.

Wrapper line classes: AllocateLine, ReuseLine, FreeIfNotReusedLine and
NullLine date from 2023; ReinterpretLine, ExternKernelAllocLine,
MultiOutputLine and FreeLine from the wrapper-IR refactor (torch 2.8);
ExternKernelMultiOutLine is newer, hence the getattr guards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch._inductor import ir as _ir
from torch._inductor.codegen import wrapper as _wrapper
from torch._inductor.graph import GraphLowering as _GraphLowering

_SILENT_LINES = tuple(getattr(_wrapper, n) for n in (
    "ExternKernelOutLine", "ExternKernelMultiOutLine", "KernelCallLine", "KernelDefinitionLine", "CommentLine",
    "EnterSubgraphLine", "ExitSubgraphLine", "EnterDeviceContextManagerLine", "ExitDeviceContextManagerLine",
    "EnterCudaStreamContextLine", "ExitCudaStreamContextLine", "SymbolicCallArgLine", "UnbackedSymbolDefsLine",
    "AssertSizeStrideLine", "AssertDivByZeroLine", "DynamicScalarLine", "IndexPutFallbackLine",
    "ScatterFallbackLine", "ConditionalLine") if hasattr(_wrapper, n))


@contextlib.contextmanager
def on_inductor_codegen(callback: Callable[[Any], None]) -> Iterator[None]:
    """Call ``callback(graph_lowering)`` after each wrapper Inductor generates in the block.

    The backward is lowered together with the forward, and the FX graph and AOTAutograd
    caches are off: a hit would skip code generation (and, AOTAutograd's, the partitioner).
    ``compile_inductor`` turns the FX graph cache back on for each graph it compiles, where
    its caller says the program is known without reading its code.
    """
    original = _GraphLowering.codegen

    def codegen(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        callback(self)
        return out

    _GraphLowering.codegen = codegen
    _PARTITIONED_OUTPUTS.clear()
    try:
        with functorch_config.patch(force_non_lazy_backward_lowering=True, enable_autograd_cache=False), \
                inductor_config.patch(fx_graph_cache=False):
            yield
    finally:
        _GraphLowering.codegen = original


def _hint(lowering: Any, expr: Any) -> int:
    sizevars = lowering.sizevars
    hint = getattr(sizevars, "optimization_hint", None) or getattr(sizevars, "size_hint")  # 2.13 / 2.11
    return int(hint(expr))


def _storage_bytes(lowering: Any, node: Any) -> int:
    size = lowering.get_allocation_storage_size(node)
    return _hint(lowering, size) * node.get_dtype().itemsize


def _layout_bytes(lowering: Any, node: Any) -> int:
    layout = node.get_layout()
    numel = _ir.compute_required_storage_length(layout.size, layout.stride, layout.offset)
    return _hint(lowering, numel) * node.get_dtype().itemsize


def graph_input_bytes(lowering: Any) -> dict[str, int]:
    """Tensor graph inputs, by name, with the bytes their layouts span."""
    out = {}
    for name, node in lowering.graph_inputs.items():
        try:
            out[name] = _layout_bytes(lowering, node)
        except (AttributeError, NotImplementedError, TypeError):
            continue  # symbolic sizes and other non-tensor inputs hold no tensor memory
    return out


def fx_placeholder_names(lowering: Any) -> list[str]:
    return list(lowering.graph_input_names)


# Output names of each graph handed to Inductor, as the partitioner named them, in order.
_PARTITIONED_OUTPUTS: list[list[str]] = []


def output_names(gm: fx.GraphModule) -> list[str]:
    output = gm.graph.find_nodes(op="output")[0]
    args = output.args[0]
    return [getattr(a, "name", "") for a in (args if isinstance(args, (tuple, list)) else [args])]


def fx_output_names(lowering: Any) -> list[str]:
    """The lowered graph's output names as the partitioner gave them (when remat compiled it)."""
    if _PARTITIONED_OUTPUTS:
        return _PARTITIONED_OUTPUTS.pop(0)
    return output_names(lowering.module)


def _owner(node: Any) -> str | None:
    """The name of the buffer or input whose storage ``node`` is."""
    while True:
        if isinstance(node, (_ir.TensorBox, _ir.StorageBox)):
            node = node.data
        elif isinstance(node, _ir.ReinterpretView) or (isinstance(node, _ir.BaseView) and hasattr(node, "data")):
            node = node.data
        else:
            break
    try:
        return node.get_name()
    except (AttributeError, NotImplementedError):
        return None


def graph_output_names(lowering: Any) -> list[str | None]:
    return [_owner(node) for node in lowering.graph_outputs]


def wrapper_lines(lowering: Any) -> list[Any]:
    return list(lowering.wrapper_code.lines)


def memory_event(line: Any) -> tuple[str, Any]:
    """("events", [...]) for a line that changes memory, ("none", None), or ("unknown", kind)."""
    lowering = _ir.V.graph
    name = type(line).__name__
    if isinstance(line, str) or not isinstance(line, _wrapper.WrapperLine):
        return "none", None
    if name == "AllocateLine":
        return "events", [("alloc", line.node.get_name(), _storage_bytes(lowering, line.node))]
    if name == "ReuseLine":
        old, new = line.node.get_name(), line.reused_as.get_name()
        events = [("alias", new, old)]
        if line.delete_old and old not in lowering.get_output_names():
            events.append(("drop", old))
        return "events", events
    if name == "ReinterpretLine":
        return "events", [("alias", line.reused_as.get_name(), line.node.get_name())]
    if name == "FreeIfNotReusedLine":
        return "events", [] if line.is_reused else [("drop", line.node.get_name())]
    if name == "FreeLine":
        return "events", [("drop", line.node.get_name())]
    if name == "NullLine":
        return "none", None
    if name == "ExternKernelAllocLine":
        return "events", [*_extern_alloc(lowering, line.node), _scratch(line.node)]
    if name in ("ExternKernelOutLine", "ExternKernelMultiOutLine"):
        return "events", [_scratch(line.node)]
    if name == "MultiOutputLine":
        return "events", [("alias", line.result_name, f"{line.arg_name}{_index_suffix(line.indices)}")]
    if isinstance(line, _SILENT_LINES):
        return "none", None
    return "unknown", name


def _scratch(node: Any) -> tuple:
    """Where an extern kernel runs: its scratch, which no line shows, is live there alone.
    Named by the FX nodes it came from (the profile measured their workspace)."""
    origins = getattr(node, "origins", None) or ()
    return ("scratch", tuple(sorted(o.name for o in origins if hasattr(o, "name"))))


def inductor_config_digest() -> bytes:
    """A digest of Inductor's settings that change the program it generates (those its own
    FX graph cache keys on)."""
    return inductor_config.get_hash()


def allocation_granularity(lowering: Any) -> int:
    """Bytes each allocation is rounded up to: the CUDA caching allocator's 512-byte blocks
    (``max_memory_allocated`` counts them), exact sizes elsewhere."""
    return 512 if "cuda" in getattr(lowering, "device_types", ()) else 1


def _index_suffix(indices: Any) -> str:
    return "".join(f"[{i}]" for _, i in indices)


def _extern_alloc(lowering: Any, node: Any) -> list[tuple]:
    """What an extern kernel that allocates its own output(s) adds."""
    layout = getattr(node, "layout", None)
    if layout is None or isinstance(layout, _ir.NoneLayout) or node.should_allocate():
        return []
    aliased = node.get_inputs_that_alias_output() if hasattr(node, "get_inputs_that_alias_output") else []
    if aliased:
        return [("alias", node.get_name(), aliased[0])]
    if isinstance(layout, _ir.MultiOutputLayout):
        return [("alloc", f"{node.get_name()}{_index_suffix(out.indices)}", _layout_bytes(lowering, out))
                for out in getattr(node, "outputs", []) or [] if isinstance(out, _ir.MultiOutput)]
    return [("alloc", node.get_name(), _storage_bytes(lowering, node))]
