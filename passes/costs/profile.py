"""Profile pass: annotate every joint-graph node with what it costs.

Writes ``node.meta["remat"]`` = :class:`NodeCost` for placeholders and
``call_function`` nodes. Each op is timed *in isolation* on random inputs
built from its arguments' ``meta["val"]``: the profiler never materializes
the whole graph's activations, so it runs even for models whose store-all
step would not fit, and repeated blocks hit the cache (op, shapes, dtypes,
non-tensor arguments) instead of being measured again.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: (x * 2).relu())
>>> from torch.fx.passes.shape_prop import ShapeProp
>>> _ = ShapeProp(gm).propagate(torch.randn(4, 4))
>>> for n in gm.graph.nodes: n.meta["val"] = n.meta.get("tensor_meta") and torch.empty(4, 4)
>>> costs = profile_graph(gm.graph, mode="analytic")
>>> costs["mul"].bytes
64
"""

from __future__ import annotations

import dataclasses
import json
import logging
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.fx as fx

from ..progress import progress

from .. import torch_adapter as adapter
from ..devices import DeviceSpec, planned_for
from ..cache.cost_table import CostTable, signature
from ..capture.taxonomy import is_alias, node_kind
from ..capture.values import describe_value, hint
from .timing import MIN_SAMPLES, caller_rng_kept, count_flops, measure_workspace, time_call

log = logging.getLogger(__name__)

Mode = Literal["measure", "analytic"]
@dataclass(frozen=True)
class DevicePeaks:
    """Throughputs for the analytic cost model (and to cost materialization)."""

    flops_per_s: float
    bytes_per_s: float

    @staticmethod
    def for_device(device: torch.device) -> DevicePeaks:
        if device.type == "cuda":
            # Hopper-class: dense bf16 matmul and HBM3e bandwidth.
            return DevicePeaks(flops_per_s=790e12, bytes_per_s=4.8e12)
        return DevicePeaks(flops_per_s=1e11, bytes_per_s=2e10)


@dataclass(frozen=True)
class NodeCost:
    """What one node costs; the unit of ``node.meta["remat"]``."""

    bytes: int  # storage bytes the node allocates (0 when it aliases ``alias_of``)
    flops: float
    seconds: float
    workspace: int  # scratch bytes beyond inputs and outputs, at the op's own peak
    kind: str  # input | view | random | matmul | reduction | pointwise | other | getitem | tuple
    alias_of: str | None = None
    measured: bool = False


@dataclass
class TimingCache:
    """(op, shapes, dtypes, arguments) -> (seconds, flops, workspace, measured)."""

    entries: dict[tuple, tuple[float, float, int, bool]] = field(default_factory=dict)
    hits: int = 0


SHARED_TIMINGS = TimingCache()


def storage_bytes(val: Any) -> int:
    """Bytes of the storage a tensor needs (its furthest element, not numel)."""
    if not isinstance(val, torch.Tensor):
        return 0
    shape = [hint(s) for s in val.shape]
    if 0 in shape:
        return 0
    span = 1 + sum((s - 1) * abs(hint(st)) for s, st in zip(shape, val.stride()))
    return (span + hint(val.storage_offset())) * val.element_size()


def multi_output_parent(node: fx.Node) -> fx.Node | None:
    """The multi-output op whose element ``node`` (a ``getitem``) picks, if any."""
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def storage_base(node: fx.Node) -> fx.Node | None:
    """The node whose storage ``node`` shares: a view's input, or, for an
    element of split / unbind / chunk, that op (itself a view of its input)."""
    if is_alias(node):
        return first_tensor_arg(node)
    parent = multi_output_parent(node)
    return parent if parent is not None and is_alias(parent) else None


def first_tensor_arg(node: fx.Node) -> fx.Node | None:
    for arg in node.all_input_nodes:
        if isinstance(arg.meta.get("val"), torch.Tensor):
            return arg
    return None


def concrete(val: Any) -> Any:
    """A real value shaped like a fake one (symbolic sizes take their hints)."""
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
        return adapter.size_hint(val)
    if not isinstance(val, torch.Tensor):
        return val
    shape = [hint(s) for s in val.shape]
    stride = [hint(s) for s in val.stride()]
    offset = hint(val.storage_offset())
    span = offset + 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride)) if all(shape) else 0
    flat = torch.empty(span, dtype=val.dtype, device=val.device)
    if val.dtype.is_floating_point or val.dtype.is_complex:
        flat.normal_()
    else:
        flat.zero_()  # indices and masks: zero is valid for every lookup
    return flat.as_strided(shape, stride, offset)


# node.meta key: the op runs channels-last in the compiled program (Inductor's layout
# optimization, set by profile_graph), so it is measured so: on the CPU a convolution on
# contiguous tensors reorders them, allocating about its output again (1 MiB where the
# channels-last call allocates 45 KB, for an 8x32x32x32 output).
CHANNELS_LAST = "remat_channels_last"


def materialize_args(node: fx.Node, *, meta: bool = False) -> tuple[tuple, dict]:
    """Real arguments for ``node`` (or, with ``meta``, storage-free ones: nothing runs)."""
    layout = node.meta.get(CHANNELS_LAST, False)

    def real(arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            val = arg.meta.get("val")
            if meta and isinstance(val, torch.Tensor):
                return torch.empty_strided([hint(s) for s in val.shape], [hint(s) for s in val.stride()],
                                           dtype=val.dtype, device="meta")
            return channels_last(concrete(val)) if layout else concrete(val)
        return arg

    return adapter.tree_map(real, node.args), adapter.tree_map(real, node.kwargs)


def channels_last(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() in (4, 5):
        return value.contiguous(memory_format=torch.channels_last if value.dim() == 4 else torch.channels_last_3d)
    return value


def cache_key(node: fx.Node) -> tuple:
    """What an op's cost depends on: the op, its arguments' sizes, strides, dtypes and devices
    (``describe_value``: a symbolic size counts as its example value, the size the op is costed at),
    and its other arguments."""
    def describe(arg: Any) -> Any:
        return describe_value(arg.meta.get("val")) if isinstance(arg, fx.Node) else repr(arg)

    key = (str(node.target), repr(adapter.tree_map(describe, node.args)), repr(adapter.tree_map(describe, node.kwargs)))
    return (*key, "channels_last") if node.meta.get(CHANNELS_LAST) else key


def device_of(graph: fx.Graph) -> torch.device:
    for node in graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def analytic_seconds(flops: float, moved_bytes: int, peaks: DevicePeaks) -> float:
    return max(flops / peaks.flops_per_s, moved_bytes / peaks.bytes_per_s)


def moved_bytes(node: fx.Node) -> int:
    ins = sum(storage_bytes(a.meta.get("val")) for a in node.all_input_nodes)
    return ins + storage_bytes(node.meta.get("val"))


def output_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return sum(storage_bytes(v) for v in (val if isinstance(val, (tuple, list)) else [val]))


def measure_op(node: fx.Node, device: torch.device, repeats: int) -> tuple[float, float, int]:
    """Seconds, FLOPs and workspace of one op, run alone on random inputs."""
    args, kwargs = materialize_args(node)

    def call() -> Any:
        return node.target(*args, **kwargs)

    flops = count_flops(call)
    seconds = time_call(call, device, repeats)
    # measured for every op: some pointwise ops allocate temporaries too (on
    # the CPU native_dropout_backward converts its mask, then multiplies twice)
    workspace = measure_workspace(call, device, output_bytes(node))
    return seconds, flops, workspace


def peaks_of(node: fx.Node, device: torch.device, spec: DeviceSpec | None) -> DevicePeaks:
    """The throughputs ``node`` is costed at: ``spec``'s for its element size, else the device's."""
    if spec is None:
        return DevicePeaks.for_device(device)
    val = node.meta.get("val")
    val = val[0] if isinstance(val, (tuple, list)) and val else val
    itemsize = val.element_size() if isinstance(val, torch.Tensor) else 4
    return DevicePeaks(flops_per_s=spec.flops_for(itemsize), bytes_per_s=spec.bandwidth)


def op_cost(node: fx.Node, mode: Mode, device: torch.device, cache: TimingCache,
            repeats: int, spec: DeviceSpec | None = None) -> tuple[float, float, int, bool]:
    # an analytic profile never reads a measured entry (the process-wide cache holds both):
    # the same graph must cost the same whatever was measured before it; nor one costed
    # for another device
    # (the spec as plain data: the process-wide cache's keys are written to the cost table as JSON)
    key = cache_key(node) if mode == "measure" else ("analytic", spec and dataclasses.astuple(spec), *cache_key(node))
    if key in cache.entries:
        cache.hits += 1
        return cache.entries[key]
    peaks = peaks_of(node, device, spec)
    result: tuple[float, float, int, bool] | None = None
    if adapter.is_collective(node):
        # never run alone: its peers are not running it (a rank waiting for rank 0's plan,
        # passes/scope/ranks.py, would leave rank 0 blocked in it); costed as the bytes it moves
        result = (analytic_seconds(0.0, moved_bytes(node), peaks), 0.0, 0, False)
    elif mode == "measure":
        try:
            seconds, flops, workspace = measure_op(node, device, repeats)
            result = (seconds, flops, workspace, True)
        except Exception as exc:  # an op that cannot run alone is costed analytically
            log.debug("could not measure %s (%s): %s", node.name, node.target, exc)
    if result is None:
        flops, scratch = 0.0, None
        try:
            args, kwargs = materialize_args(node, meta=True)
            flops = count_flops(lambda: node.target(*args, **kwargs))
            # an op whose eager kernel is Python (Inductor's prims.fma) holds its temporaries: counted
            # from that kernel run on meta; any other op's scratch is the device's, and unknown here
            scratch = adapter.python_kernel_scratch(node.target, args, kwargs)
        except Exception as exc:
            log.debug("no FLOP count for %s: %s", node.name, exc)
        result = (analytic_seconds(flops, moved_bytes(node), peaks), flops, scratch or 0, False)
    cache.entries[key] = result
    return result


def annotate(node: fx.Node, mode: Mode, device: torch.device, cache: TimingCache,
             repeats: int, spec: DeviceSpec | None = None) -> NodeCost:
    kind = node_kind(node)
    val = node.meta.get("val")
    base = storage_base(node) if node.op == "call_function" else None
    if base is not None or kind == "view":
        return NodeCost(bytes=0, flops=0.0, seconds=0.0, workspace=0, kind="view",
                        alias_of=base.name if base is not None else None)
    if kind in ("input", "getitem") or node.op != "call_function":
        return NodeCost(bytes=storage_bytes(val), flops=0.0, seconds=0.0, workspace=0, kind=kind)
    seconds, flops, workspace, measured = op_cost(node, mode, device, cache, repeats, spec)
    return NodeCost(bytes=storage_bytes(val), flops=flops, seconds=seconds,
                    workspace=workspace, kind=kind, measured=measured)


def profile_graph(graph: fx.Graph, *, mode: Mode = "measure", cache: TimingCache | None = None,
                  repeats: int = MIN_SAMPLES, cost_folder: Path | None = None,
                  inductor: bool = False) -> dict[str, NodeCost]:
    """Annotate every node of ``graph`` with ``node.meta["remat"]``; return them by name.

    With ``cost_folder``, measured costs are read from and added to the op cost table
    there (:mod:`.cost_table`): an op measured by an earlier process is not measured again.
    A meta graph is costed analytically, for the device :func:`.devices.planning_for` names
    (this machine's CPU figures without one).
    ``inductor``: the graph is compiled by Inductor, so its convolutions are measured in the
    layout Inductor gives them (:data:`CHANNELS_LAST`).
    """
    if mode not in ("measure", "analytic"):
        raise ValueError(f"profile mode must be 'measure' or 'analytic', not {mode!r}")
    cache = cache if cache is not None else TimingCache()
    device = device_of(graph)
    spec = None
    if device.type == "meta":  # nothing can run: every op is costed analytically, for the device planned for
        mode, spec = "analytic", planned_for()
    table = CostTable(cost_folder, device) if cost_folder is not None and mode == "measure" else None
    if table is not None:
        for sig, entry in table.load().items():
            cache.entries.setdefault(tuple(json.loads(sig)), entry)
    costs: dict[str, NodeCost] = {}
    layout = inductor and mode == "measure" and adapter.inductor_channels_last(graph)
    for node in graph.nodes:
        if node.target in adapter.CONVOLUTIONS:
            node.meta[CHANNELS_LAST] = layout

    def annotate_all() -> None:
        with caller_rng_kept(device):
            for node in progress(list(graph.nodes), desc="remat: profiling", unit="op"):
                if node.op in ("placeholder", "call_function"):
                    node.meta["remat"] = costs[node.name] = annotate(node, mode, device, cache, repeats, spec)

    # on remat's own thread: no profiler of the caller's sees the ops measured, nor slows them
    with adapter.MeasuringThread(device) as thread:
        thread.run(annotate_all)
    if table is not None:
        # measured costs only: the table is this device's measurements (analytic ones are recomputed)
        table.store({signature(key): entry for key, entry in cache.entries.items() if key[:1] != ("analytic",)})
    log.debug("profiled %d nodes, %d cache hits", len(costs), cache.hits)
    return costs
