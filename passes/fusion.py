"""Inductor's fusion, as the problem models it: which values no buffer ever holds.

Under ``compiler="inductor"`` a pointwise value whose readers all fuse it (pointwise ops and
reductions of its own graph) is computed inside their kernels and never allocated, unless
Inductor's realization heuristic writes it to memory. ``inlined_values`` and ``fusion_sets``
model that rule; ``apply_fusion`` discounts the bytes Inductor never allocates from the value
fields :func:`.problem.build_problem` builds, and ``produced_at`` is the step that allocates
a value (a multi-output op's, for its elements).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.fx as fx

from . import torch_adapter as adapter
from .profile import NodeCost, multi_output_parent

if TYPE_CHECKING:
    from .problem import Order


# Inductor's realization heuristic for a pointwise value read more than once
# (``StorageBox.should_realize_on_reuse``): it is written to memory when its inlined
# body reads more than ``reads`` buffers, counts more than ``ops`` ops (each buffer
# load is one), or, on the CPU, uses an op Inductor deems heavy; otherwise every
# reader recomputes it inline and no buffer is ever allocated. A body reading more
# than ``acc_reads`` buffers is realized whatever its readers. The limits are read
# from this torch's Inductor config (``torch_adapter.realize_thresholds``): torch
# 2.13 raised the CPU ones (torch 2.11's, on any device: 4 reads, 30 ops, 8 accumulated reads).
CPU_HEAVY_OPS = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})


@dataclass(frozen=True)
class Inline:
    """What a value inlined into its readers carries: the buffers it reads, its op count, heavy ops."""

    reads: frozenset[fx.Node]
    ops: int
    heavy: bool


def op_name(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]


def inlined_values(steps: list[fx.Node], costs: dict[str, NodeCost], outputs: set[fx.Node], *,
                   cpu: bool, across: set[fx.Node] = frozenset()) -> set[fx.Node]:
    """The pointwise values among ``steps`` (one graph's nodes, in order) that Inductor
    computes inside their readers' kernels, so that no buffer holds them.

    A value is realized when a reader is not pointwise or a reduction (a matmul,
    an extern kernel, a view), when it leaves the graph, when its body grows past
    the accumulated-reads limit, or when it has several readers and its body
    trips Inductor's reuse heuristic. Readers outside ``steps`` count as
    non-fusing readers (the value crosses graphs), except for values in
    ``across``, whose outside readers read a kept or recomputed copy."""
    inside = set(steps)
    max_reads, max_ops, max_acc_reads = adapter.realize_thresholds(cpu)
    bodies: dict[fx.Node, Inline] = {}
    for node in steps:
        if costs.get(node.name) is None or costs[node.name].kind != "pointwise" or node in outputs:
            continue
        body = inline_body(node, bodies)
        users = [u for u in node.users if u in inside or node not in across]
        fusing = all(u in inside and costs.get(u.name) is not None
                     and costs[u.name].kind in ("pointwise", "reduction") for u in users)
        if not fusing or len(body.reads) > max_acc_reads:
            continue
        opcount = body.ops + len(body.reads)  # Inductor counts each load as an op
        if len(users) > 1 and (opcount > max_ops or len(body.reads) > max_reads or (cpu and body.heavy)):
            continue
        bodies[node] = body
    return set(bodies)


def inline_body(node: fx.Node, bodies: dict[fx.Node, Inline]) -> Inline:
    """``node``'s body with its inlined operands' bodies folded in."""
    reads: set[fx.Node] = set()
    ops, heavy = 1, op_name(node) in CPU_HEAVY_OPS
    for arg in node.all_input_nodes:
        inner = bodies.get(arg)
        if inner is None:
            reads.add(arg)
            continue
        reads |= inner.reads
        ops += inner.ops
        heavy = heavy or inner.heavy
    return Inline(frozenset(reads), ops, heavy)


def produced_at(node: fx.Node, order: Order) -> int:
    """An element of a multi-output op is allocated by the op, not by ``getitem``."""
    parent = multi_output_parent(node)
    if parent is not None and parent in order.step_of:
        return order.step_of[parent]
    return order.step_of[node]


def apply_fusion(node: fx.Node, field: dict, inlined: set[fx.Node], inlined_anywhere: set[fx.Node],
                 order: Order) -> None:
    """Discount bytes Inductor never allocates (see ``inlined_values``)."""
    if node in inlined_anywhere:
        field["recompute_bytes"] = 0  # recomputed straight into fused consumers
    if node in inlined:
        if field.get("need_start") is None:
            field["bytes"] = 0
        elif node in order.forward:
            field["fused_in_forward"] = True


def fusion_sets(order: Order, costs: dict[str, NodeCost], outputs: set[fx.Node],
                cpu: bool) -> tuple[set[fx.Node], set[fx.Node]]:
    """(values inlined within their own graph, forward values inlined wherever they are recomputed)."""
    forward = [n for n in order.steps if n in order.forward]
    backward = [n for n in order.steps if n not in order.forward]
    # a forward value the backward reads is a graph output unless recomputed there: judge
    # its forward readers only, as the plan decides whether it crosses
    fwd_outputs = {n for n in outputs if n in order.forward}
    crossing = {n for n in forward if any(u not in order.forward for u in n.users)}
    in_forward = inlined_values(forward, costs, fwd_outputs, cpu=cpu, across=crossing)
    in_backward = inlined_values(backward, costs, outputs, cpu=cpu)
    anywhere = inlined_values(order.steps, costs, outputs, cpu=cpu)
    return in_forward | in_backward, anywhere & order.forward
