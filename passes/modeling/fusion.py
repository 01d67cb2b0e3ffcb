"""Inductor's fusion, as the problem models it: which values no buffer ever holds.

Under ``compiler="inductor"`` a pointwise value whose readers all fuse it (pointwise ops and
reductions of its own graph) is computed inside their kernels and never allocated, unless
Inductor's realization heuristic writes it to memory. ``inlined_values`` and ``fusion_sets``
model that rule; ``apply_fusion`` discounts the bytes Inductor never allocates from the value
fields :func:`.problem.build_problem` builds, and ``produced_at`` is the step that allocates
a value (a multi-output op's, for its elements).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from remat.solvers.problem import Kind

from .. import torch_adapter as adapter
from ..costs.profile import NodeCost, multi_output_parent

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


def inlined_early(steps: list[fx.Node], costs: dict[str, NodeCost], outputs: set[fx.Node],
                  inlined: set[fx.Node]) -> dict[fx.Node, frozenset[fx.Node]]:
    """Readers that compute a realized pointwise value inline, and the buffers they read for it.

    Inductor lowers in graph order and realizes a pointwise value read through views by an
    extern kernel only when that kernel lowers: a pointwise or reduction reader lowered before
    then computes the value from its inputs. In a softmax backward ``fma`` feeds two matmuls
    through a view and a batch sum lowered first, so the sum read the scores' gradient and the
    saved softmax output, not ``fma``, and kept both alive (and ``fma`` from taking either's
    buffer) until it ran."""
    kind = {n: costs[n.name].kind if n.name in costs else None for n in steps}
    step_of = {n: i for i, n in enumerate(steps)}
    bodies: dict[fx.Node, Inline] = {}
    early: dict[fx.Node, frozenset[fx.Node]] = {}
    for node in steps:
        body = inline_body(node, bodies)
        if node in inlined:
            bodies[node] = body
            continue
        if kind[node] != "pointwise" or node in outputs or len(node.users) < 2:
            continue
        if any(u not in step_of or kind[u] not in ("pointwise", "reduction", "view") for u in node.users):
            continue  # a direct extern or outside reader: realized as it lowers
        realized_at = min((step_of[c] for c in view_consumers(node, kind, step_of)), default=None)
        for user in node.users:
            if realized_at is not None and kind[user] in ("pointwise", "reduction") and step_of[user] < realized_at:
                early[user] = early.get(user, frozenset()) | body.reads
    return early


def view_consumers(node: fx.Node, kind: dict, step_of: dict) -> list[fx.Node]:
    """The readers of ``node``'s views that are not views, pointwise ops or reductions."""
    found, todo = [], [u for u in node.users if kind.get(u) == "view"]
    while todo:
        view = todo.pop()
        for user in view.users:
            if kind.get(user) == "view":
                todo.append(user)
            elif user in step_of and kind.get(user) not in ("pointwise", "reduction"):
                found.append(user)
    return found


def early_inlining(order: Order, costs: dict[str, NodeCost], outputs: set[fx.Node],
                   inlined: set[fx.Node]) -> dict[fx.Node, frozenset[fx.Node]]:
    """:func:`inlined_early` in each of the two graphs."""
    return {**inlined_early(order.forward_steps, costs, outputs, inlined),
            **inlined_early(order.backward_steps, costs, outputs, inlined)}


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
    forward, backward = order.forward_steps, order.backward_steps
    # a forward value the backward reads is a graph output unless recomputed there: judge
    # its forward readers only, as the plan decides whether it crosses
    fwd_outputs = {n for n in outputs if n in order.forward}
    crossing = {n for n in forward if any(u not in order.forward for u in n.users)}
    in_forward = inlined_values(forward, costs, fwd_outputs, cpu=cpu, across=crossing)
    in_backward = inlined_values(backward, costs, outputs, cpu=cpu)
    anywhere = inlined_values(order.steps, costs, outputs, cpu=cpu)
    return in_forward | in_backward, anywhere & order.forward


# Views that keep an element where it was (a contiguous buffer read as another shape): a kernel
# reading a buffer through them reads it at the index it writes its output at.
SAME_INDEX_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "alias"})


def reused_in_place(order: Order, values: dict[fx.Node, dict], costs: dict[str, NodeCost],
                    inlined: set[fx.Node]) -> dict[fx.Node, fx.Node]:
    """output -> the input buffer Inductor writes it into (``decide_inplace_update``): a pointwise
    kernel whose output has the size and dtype of a buffer it reads, at the output's own index,
    that no later step reads. With ``allow_buffer_reuse`` off this still happens, saved
    activations the backward is handed included (donated buffers): a softmax backward writes its
    result into the saved softmax output. Buffers a kernel reads through inlined values count."""
    claimed: dict[fx.Node, fx.Node] = {}
    taken: set[fx.Node] = set()
    for node in order.steps:
        value = values.get(node)
        if value is None or not value["bytes"] or costs[node.name].kind != "pointwise" or node in inlined:
            continue
        for read in same_index_reads(node, costs, inlined):
            if read not in taken and can_take(read, node, values, order.step_of[node], costs):
                claimed[node] = read
                taken.add(read)
                break
    return claimed


def same_index_reads(node: fx.Node, costs: dict[str, NodeCost], inlined: set[fx.Node]) -> list[fx.Node]:
    """The buffers ``node``'s kernel reads only at the index it writes, through inlined values and
    index-keeping views."""
    same: list[fx.Node] = []
    other: set[fx.Node] = set()
    todo = [(arg, True) for arg in node.all_input_nodes]
    while todo:
        arg, aligned = todo.pop()
        cost = costs.get(arg.name)
        if cost is not None and cost.kind == "view":
            todo += [(a, aligned and op_name(arg) in SAME_INDEX_VIEWS) for a in arg.all_input_nodes]
        elif arg in inlined:
            todo += [(a, aligned) for a in arg.all_input_nodes]
        elif aligned and cost is not None and cost.kind not in ("getitem", "tuple", "input") \
                and same_elements(arg, node):
            same.append(arg)
        else:
            other.add(arg)
    return [read for read in dict.fromkeys(same) if read not in other]


def same_elements(read: fx.Node, node: fx.Node) -> bool:
    a, b = read.meta.get("val"), node.meta.get("val")
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.numel() == b.numel() and a.is_contiguous() and b.is_contiguous())


def can_take(read: fx.Node, node: fx.Node, values: dict[fx.Node, dict], step: int,
             costs: dict[str, NodeCost]) -> bool:
    """Whether ``read``'s buffer is free for ``node`` to write into: the same bytes, read last at
    ``step`` whatever the plan (a forward value the backward may need only from a backward writer)."""
    value, writer = values.get(read), values[node]
    if value is None or value["bytes"] != writer["bytes"] or value["produced"] >= step:
        return False
    if value.get("need_start") is None:
        return value["last_use"] == step
    return (writer["kind"] is not value["kind"] and value["need_end"] == step
            and value["need_start"] < step and value["last_use"] < step
            and not recomputed_after(read, values, step, costs))


def recomputed_after(read: fx.Node, values: dict[fx.Node, dict], step: int, costs: dict[str, NodeCost]) -> bool:
    """Whether a forward reader of ``read`` (through views) may be recomputed at ``step`` or
    later: a recomputation for the op after ``step`` counts at ``step`` and runs after its
    writer, so the buffer is not free there. (A reader read directly at ``step`` is recomputed
    before the writer; it counts too: an over-count of one buffer at most.)"""
    todo = list(read.users)
    while todo:
        user = todo.pop()
        value = values.get(user)
        if value is None or value["kind"] is not Kind.FORWARD:
            continue
        if costs[user.name].kind == "view":
            todo += user.users  # its readers read the buffer
        elif value.get("need_end") is not None and value["need_end"] >= step:
            return True
    return False


def read_where_inlined(values: dict[fx.Node, dict], inlined: set[fx.Node],
                       early: dict[fx.Node, frozenset[fx.Node]]) -> None:
    """A value Inductor inlines is computed inside each reader's kernel, so what it reads is
    read there: alive until the inlined value's last reader, not only until its own step. On a
    softmax backward (``mul = grad * out``, inlined into its sum and into ``fma``) the scores'
    gradient and the saved softmax output live until ``fma`` is written. ``early``: readers
    that compute a realized value inline (``fusion.inlined_early``), with the buffers that
    takes. Latest first, so a chain of inlined values carries its last reader's step back to
    the buffers its first one reads."""
    readers = {n for n in (*inlined, *early) if n in values}
    for node in sorted(readers, key=lambda n: values[n]["produced"], reverse=True):
        reader = values[node]
        end = reader["last_use"] if node in inlined else reader["produced"]
        reads = (node.all_input_nodes if node in inlined else ()), early.get(node, ())
        for arg in (arg for group in reads for arg in group):
            value = values.get(arg)
            if value is None:  # a graph input: alive throughout
                continue
            if reader["kind"] is Kind.BACKWARD and value["kind"] is Kind.FORWARD:
                widen_need(value, reader["produced"], end)
            elif reader["kind"] is value["kind"]:
                value["last_use"] = max(value["last_use"], end)


def widen_need(base: dict, start: int, end: int) -> None:
    base["need_start"] = min(start, base["need_start"] if base.get("need_start") is not None else math.inf)
    base["need_end"] = max(end, base.get("need_end") or 0)


def end_before(value: dict, step: int) -> None:
    """The buffer is the writer's from ``step`` on: it ends the step before."""
    if value.get("need_start") is None:
        value["last_use"] = step - 1
    else:
        value["need_end"] = step - 1
