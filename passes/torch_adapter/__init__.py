"""Every private torch API remat touches, in one place.

torch 2.11 to 2.14 keep these names; when one moves, only this package
changes. The rest of remat imports from here, never from
``torch._functorch`` or ``torch._inductor`` directly. The reader of Inductor's
generated program lives in ``inductor_program``; its names are re-exported here.
The scheduler pass that keeps Inductor's kernel order near the plan's lives in
``inductor_order``; the DDP and FSDP2 helpers live in ``distributed``, re-exported here too.

How remat reaches the joint graph: torch's own min-cut partitioner
(``min_cut_rematerialization_partition``) does the version-sensitive work
around the decision (CSE, recompute tags, forced saves of collectives and
mutations, symbolic sizes, RNG functionalization, building the forward and
backward modules, reordering the backward like the autograd engine). Its one
decision, *which values to save*, is the module-level function
``choose_saved_values_set``. remat swaps that function, and only while
remat's own compile runs, so the rest of the pipeline stays torch's.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as _partitioners
from torch._inductor import config as inductor_config
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch.fx.experimental.proxy_tensor import is_sym_node

from . import aot_cache
from .aot_cache import ProgramEntry, program_cache_usable, recording_program_entries, without_plan_key  # re-exported
from .distributed import (  # re-exported
    FsdpGroup,
    compiling_ddp_bucket,
    fsdp2_groups,
    is_ddp_module,
    is_fsdp2_module,
    modules_being_called,
)
from .profiler import (  # re-exported
    MeasuringThread,
    OwnSession,
    ProfilerBusy,
    caller_is_profiling,
    on_device,
    own_memory_events,
    profiler_mark,
    thread_memory_peak,
    when_backward_returns,
)
from .traced import traced_real_tensors  # re-exported
from .python_kernels import python_kernel_scratch  # re-exported
from .inductor_order import LocalFusion, addmm_folded, can_unfold, fusion_choices, order_settings, unfold
from .inductor_program import (  # re-exported: the adapter is one namespace
    _PARTITIONED_OUTPUTS,
    allocation_granularity,
    fx_output_names,
    fx_placeholder_names,
    graph_input_bytes,
    graph_output_names,
    inductor_config_digest,
    memory_event,
    on_inductor_codegen,
    output_names,
    wrapper_lines,
)

__all__ = [
    "ChooseSaved",
    "NodeInfo",
    "OP_TYPES",
    "compile_inductor",
    "is_sym_node",
    "min_cut_saved_values",
    "saved_values_chooser",
]

NodeInfo = _partitioners.NodeInfo
# (joint_graph, node_info) -> the nodes the forward hands to the backward
ChooseSaved = Callable[[fx.Graph, Any], list[fx.Node]]
# The same op categories torch's partitioner uses (fusible, random, views...).
OP_TYPES = _partitioners.get_default_op_list()
_ORIGINAL_CHOOSER = _partitioners.choose_saved_values_set


def min_cut_saved_values(joint_graph: fx.Graph, node_info: Any) -> list[fx.Node]:
    """What ``torch.compile``'s default partitioner saves for this graph."""
    return _ORIGINAL_CHOOSER(joint_graph, node_info, memory_budget=1.0)


@contextlib.contextmanager
def saved_values_chooser(choose: ChooseSaved) -> Iterator[None]:
    """Route torch's partitioner decision to ``choose`` while the block runs.

    The autograd cache is disabled meanwhile: a cache hit would skip the
    partitioner, and with it remat's plan and report.
    """

    def patched(joint_graph: fx.Graph, node_info: Any, memory_budget: float = 1) -> list[fx.Node]:
        return choose(joint_graph, node_info)

    _partitioners.choose_saved_values_set = patched
    try:
        with functorch_config.patch(enable_autograd_cache=False), inductor_config.patch(
            fx_graph_cache=False
        ):
            yield
    finally:
        _partitioners.choose_saved_values_set = _ORIGINAL_CHOOSER


GraphHook = Callable[[fx.GraphModule, str], object]
# Inductor keeps a freed buffer allocated until a later buffer of the same
# size reuses it, however far away: memory the plan counts as free stays
# held. Freeing at last use makes the step peak where the plan says. Each fused
# kernel runs where its last part was (``inductor_order``), so no recompute runs
# earlier than the plan put it.
INDUCTOR_SETTINGS = {"allow_buffer_reuse": False, **order_settings()}
# ... and no fusion delays a kernel's outputs past an extern kernel (``inductor_order``).
INDUCTOR_CHOICES: type | None = LocalFusion


def compile_inductor(
    gm: fx.GraphModule, example_inputs: Sequence[Any], *, on_graph: GraphHook, fx_graph_cache: bool = True
) -> Callable[..., Any]:
    """Compile with Inductor; ``on_graph`` sees each partitioned graph first.

    Inductor's FX graph cache keys on the partitioned graph, so a hit loads this plan's
    own program; but it generates no code, which the compiled account reads: a caller
    that needs the account and got a hit compiles again with ``fx_graph_cache=False``.
    """

    def inner(graph: fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
        on_graph(graph, "backward" if kwargs.get("is_backward") else "forward")
        # Inductor's post-grad passes may rename the forward's outputs; the backward
        # reads them under the partitioner's names, so note those now.
        _PARTITIONED_OUTPUTS.append(output_names(graph))
        # Runs when the graph is compiled (the backward lazily, at its first
        # call), so the settings are applied here rather than around compile_fx.
        with inductor_config.patch({**INDUCTOR_SETTINGS, "fx_graph_cache": fx_graph_cache, **without_plan_key()}), \
                fusion_choices(INDUCTOR_CHOICES):
            return compile_fx_inner(graph, inputs, **kwargs)

    return compile_fx(gm, example_inputs, inner_compile=inner)


def program_cache(digest: str) -> contextlib.AbstractContextManager[None]:
    """AOTAutograd's cache on in the block, keyed on the plan ``digest`` (``aot_cache``), under
    the settings remat compiles with."""
    return aot_cache.keyed_on_plan(digest, INDUCTOR_SETTINGS)


def store_program_entry(program: ProgramEntry, digest: str) -> None:
    """Write a recorded entry under the key ``program_cache(digest)`` looks up (``aot_cache``)."""
    aot_cache.store_entry(program, digest, INDUCTOR_SETTINGS)


CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


def inductor_channels_last(graph: fx.Graph) -> bool:
    """Whether Inductor lays this joint graph's convolutions out channels-last (its layout
    optimization: always on the CPU with mkldnn, by size heuristics on CUDA). The backward's
    convolutions then read channels-last activations too."""
    from torch._inductor.graph import GraphLowering

    holder = types.SimpleNamespace(graph=graph)  # the heuristic reads only the graph
    return bool(GraphLowering.decide_layout_opt(holder, is_inference=False))  # type: ignore[arg-type]


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process (any backend)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def fx_graph_cache_counts() -> dict[str, int]:
    """Inductor's FX graph cache hits and misses in this process so far."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return {"hit": inductor["fxgraph_cache_hit"], "miss": inductor["fxgraph_cache_miss"]}


def ambient_state() -> Callable[[], contextlib.AbstractContextManager[None]]:
    """A context that restores, later, the state a backend traces under now.

    AOTAutograd traces a dynamo graph under the caller's grad mode and autocast, which the
    graph itself does not record; a compile run after the backend returned (a figure
    computed when read) must see the same, wherever it is read from.
    """
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices]

    @contextlib.contextmanager
    def restore() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.enable_grad())
            for device, enabled, dtype in autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled))
            yield

    return restore


def aot_min_cut_backend(fw_compiler: Callable[..., Any], bw_compiler: Callable[..., Any]) -> Callable[..., Any]:
    """An AOTAutograd backend that decomposes and partitions as Inductor does (its decomposition
    table, torch's min-cut partitioner) and hands the two graphs to the given compilers."""
    from torch._inductor.decomposition import select_decomp_table

    partition = functools.partial(_partitioners.min_cut_rematerialization_partition, compiler="inductor")
    return aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler, partition_fn=partition,
                        decompositions=select_decomp_table())


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Leave the fake-tensor (and proxy) modes the partitioner runs under, to measure real ops."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def specialize_sizes(graph: fx.Graph) -> bool:
    """Guard every symbolic input size on its current value; whether there were any."""
    found = False
    for node in graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        sizes = [*val.shape, *val.stride()] if isinstance(val, torch.Tensor) else [val]
        for size in sizes:
            if isinstance(size, torch.SymInt):
                int(size)  # guards: dynamo recompiles for another value
                found = True
    return found


def reset_compiled() -> None:
    """Forget every compiled graph, so the next call captures and plans again."""
    import torch._dynamo

    torch._dynamo.reset()


def realize_thresholds(cpu: bool) -> tuple[int, int, int]:
    """Inductor's reuse heuristic's limits on this torch, as its ``ir`` reads them: (reads, ops,
    accumulated reads) past which a pointwise value read more than once is written to memory.
    torch 2.13 has CPU-only op and accumulated-read limits (50 and 12); older ones use 30 and 8."""
    c = inductor_config
    ops = c.realize_opcount_threshold
    if ops is None:
        default = getattr(c, "_realize_opcount_threshold_default", 30)
        ops = getattr(c, "realize_cpu_opcount_threshold", default) if cpu else default
    acc = c.realize_acc_reads_threshold
    if acc is None:
        default = getattr(c, "_realize_acc_reads_threshold_default", 8)
        acc = getattr(c, "realize_cpu_acc_reads_threshold", default) if cpu else default
    return c.realize_reads_threshold, ops, acc


def op_schema(node: fx.Node) -> Any:
    """The ATen schema of a node's op (arguments, returns, mutability), or None for other targets."""
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


def recompute_tag(node: fx.Node) -> str | None:
    """The selective-checkpoint tag torch's tracing put on ``node`` ("must_save",
    "prefer_save", "must_recompute" or "prefer_recompute"), or None."""
    tag = node.meta.get("recompute")
    return None if tag is None else getattr(tag, "name", str(tag)).lower()


def is_collective(node: fx.Node) -> bool:
    """A distributed collective (functional or in-place c10d op)."""
    return node.op == "call_function" and "c10d" in str(node.target)


@functools.cache
def inductor_random_prims() -> frozenset[Any]:
    """Inductor's own random prims (its decomposition of dropout and rand): lowered to
    generated code, never run as a kernel of their own."""
    names = ("inductor_random", "inductor_randint", "inductor_seeds", "inductor_lookup_seed")
    return frozenset(op for op in (getattr(torch.ops.prims, n, None) for n in names) if op is not None)


def inductor_generates_pointwise(node: fx.Node) -> bool:
    """A pointwise op Inductor writes into a kernel: the partitioner's fusible list, or an op
    tagged pointwise that Inductor lowers (its decompositions emit prims such as ``prims.fma``,
    from ``_softmax_backward_data``, which the partitioner's list does not name)."""
    if OP_TYPES.is_fusible(node):
        return True
    target = node.target
    if node.op != "call_function" or torch.Tag.pointwise not in getattr(target, "tags", ()):
        return False
    from torch._inductor import lowering
    return target in lowering.lowerings


def random_op_targets() -> frozenset[Any]:
    """Ops whose recomputation would draw fresh random numbers."""
    return frozenset(OP_TYPES.random_ops) | inductor_random_prims()


def aten_packet(node: fx.Node) -> Any:
    """The overload packet of a node's target (``aten.mm`` for ``aten.mm.default``)."""
    return _partitioners.get_aten_target(node)


def register_backend(name: str, fn: Callable[..., Any]) -> None:
    """Register a dynamo backend by name unless one is known under it already."""
    from torch._dynamo.backends import registry

    if name in registry._BACKENDS:  # registered, or an installed entry point dynamo loads itself
        return
    registry.register_backend(name=name)(fn)


def is_graph_break(exc: BaseException) -> bool:
    """Whether dynamo raised ``exc`` because ``fullgraph=True`` met something it breaks the graph at."""
    from torch._dynamo.exc import Unsupported, UserError

    return isinstance(exc, (Unsupported, UserError))


def unwrap_backend_error(exc: BaseException) -> BaseException | None:
    """The exception a backend raised, from inside dynamo's wrapper."""
    from torch._dynamo.exc import BackendCompilerFailed

    if isinstance(exc, BackendCompilerFailed):
        return exc.inner_exception
    return None


@contextlib.contextmanager
def functorch_settings(**settings: Any) -> Iterator[None]:
    """``torch._functorch.config`` patched for the block (e.g. torch's ``activation_memory_budget``)."""
    with functorch_config.patch(**settings):
        yield


@contextlib.contextmanager
def inductor_settings(**settings: Any) -> Iterator[None]:
    """``torch._inductor.config`` patched for the block (e.g. ``fallback_random=True``: Inductor
    draws random numbers with aten's ops, so compiled dropout masks equal eager's)."""
    with inductor_config.patch(**settings):
        yield


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``fn`` applied to every leaf of nested lists, tuples and dicts (torch's pytree)."""
    from torch.utils._pytree import tree_map as _tree_map

    return _tree_map(fn, tree)


def size_hint(size: int | torch.SymInt | torch.SymFloat | torch.SymBool) -> Any:
    """A symbolic size's example value, read without adding a guard (1 when it has none)."""
    if isinstance(size, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node_hint = size.node.hint
        return type(node_hint)(node_hint) if node_hint is not None else 1
    return size


def mutated_inputs(graph: fx.Graph) -> set[str]:
    """Placeholders of a joint graph whose data the step updates in place
    (buffers written in the forward), read from AOTAutograd's output descriptors."""
    placeholders = {repr(n.meta.get("desc")): n.name for n in graph.find_nodes(op="placeholder")}
    descs = graph.find_nodes(op="output")[0].meta.get("desc") or []
    returned = {placeholders[repr(d.mutated_input)] for d in descs
                if type(d).__name__ == "InputMutationAOTOutput" and repr(d.mutated_input) in placeholders}
    # Inductor keeps input mutations in the graph (keep_input_mutations): a copy_ into the placeholder
    in_graph = {n.args[0].name for n in graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)
                if isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder"}
    return returned | in_graph
