"""Problem pass: joint graph + ``node.meta["remat"]`` -> a torch-free :class:`Problem`.

The fixed execution order is the forward (the nodes the forward outputs
need, in graph order) followed by everything else in graph order. Nodes the
forward does not need are computed in the backward whatever the plan, so
they are BACKWARD values with fixed intervals; the decisions are only about
forward values the backward reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.fx as fx

from remat.solvers.problem import Kind, Problem, Value

from .. import torch_adapter as adapter
from .fusion import (apply_fusion, early_inlining, end_before, fusion_sets, produced_at, read_where_inlined,
                     reused_in_place, widen_need)
from ..costs.profile import DevicePeaks, NodeCost, device_of, multi_output_parent
from .policies import Pin, Policy, Verdict, with_safety
from ..capture.taxonomy import CATEGORY, classify, repeated_blocks

# Recomputing a pointwise op that Inductor fuses into its consumer costs a
# fraction of running it alone: its inputs are read anyway, its output is
# never written.
FUSED_RECOMPUTE_FRACTION = 0.1
GENERATED_KINDS = frozenset({"pointwise", "reduction"})  # op kinds Inductor writes kernels for


@dataclass
class Order:
    """The fixed step order and who reads what, by node. ``unfolded``: the adds whose matmul
    remat keeps Inductor from folding into them (:func:`fold_holds_more`), by name."""

    steps: list[fx.Node]
    step_of: dict[fx.Node, int]
    forward: set[fx.Node]
    unfolded: frozenset[str] = frozenset()

    @property
    def last(self) -> int:
        return len(self.steps) - 1

    @cached_property
    def forward_steps(self) -> list[fx.Node]:
        return [n for n in self.steps if n in self.forward]

    @cached_property
    def backward_steps(self) -> list[fx.Node]:
        return [n for n in self.steps if n not in self.forward]


def fixed_order(graph: fx.Graph, node_info: adapter.NodeInfo, *, inductor: bool = False) -> Order:
    """``inductor``: each matmul Inductor folds into the add that reads it runs at that add,
    unless remat keeps it from folding there (the add is then in ``Order.unfolded``)."""
    ops = [n for n in graph.nodes if n.op == "call_function"]
    forward = {n for n in ops if node_info.is_required_fw(n)}
    # An output of a forward op that only the backward reads (layer norm's
    # mean and rstd) exists once the forward op ran: it is a forward value.
    forward |= {n for n in ops if multi_output_parent(n) in forward}
    fwd = [n for n in ops if n in forward]
    bwd = [n for n in ops if n not in forward]
    folded = addmm_folded(ops, forward) if inductor else {}
    as_listed = fwd + backward_order(bwd, graph)
    unfolded = {add for add, mm in folded.items() if fold_holds_more(mm, add, as_listed)}
    folded = {add: mm for add, mm in folded.items() if add not in unfolded}
    steps = with_folded_at_add(fwd, folded) + backward_order(bwd, graph, deferred=set(folded.values()))
    return Order(steps, {n: i for i, n in enumerate(steps)}, forward, frozenset(n.name for n in unfolded))


def unfolded_adds(graph: fx.Graph, node_info: adapter.NodeInfo) -> frozenset[str]:
    """The adds remat keeps Inductor from folding a matmul into (``adapter.unfold`` them)."""
    return fixed_order(graph, node_info, inductor=True).unfolded


def addmm_folded(ops: list[fx.Node], forward: set[fx.Node]) -> dict[fx.Node, fx.Node]:
    """add -> the matmul Inductor folds into it (an ``addmm`` at the add), both in one graph."""
    folded = {}
    for add in ops:
        mm = adapter.addmm_folded(add)
        if mm is not None and (mm in forward) == (add in forward):
            folded[add] = mm
    return folded


def fold_holds_more(mm: fx.Node, add: fx.Node, steps: list[fx.Node]) -> bool:
    """Whether folding ``mm`` into ``add`` holds more memory than it saves: folded, the matmul's
    inputs live until the add; unfolded, its product alone does. Undone where some step lies
    between the two, the inputs (parameters and batch aside: they live throughout) outweigh the
    product, and the add can be undone (``adapter.can_unfold``). With tied embeddings this keeps
    the logits gradient from living through the whole backward for the LM head's weight gradient."""
    at = {n: i for i, n in enumerate(steps)}
    if at[add] - at[mm] <= 1 or not adapter.can_unfold(add):
        return False
    held = sum(value_bytes(a) for a in mm.all_input_nodes if not is_placeholder_view(a))
    return held > value_bytes(mm)


def is_placeholder_view(node: fx.Node) -> bool:
    """A graph input, or a view of one (a transposed weight)."""
    while node.op == "call_function" and getattr(node.target, "is_view", False):
        node = node.args[0]
    return node.op == "placeholder"


def value_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    return int(adapter.size_hint(val.numel())) * val.element_size()


def with_folded_at_add(steps: list[fx.Node], folded: dict[fx.Node, fx.Node]) -> list[fx.Node]:
    """``steps`` with each folded matmul moved to just before its add."""
    moved = set(folded.values())
    order: list[fx.Node] = []
    for node in steps:
        if node in folded:
            order.append(folded[node])
        if node not in moved:
            order.append(node)
    return order


def backward_order(backward: list[fx.Node], graph: fx.Graph, *, deferred: set[fx.Node] = frozenset()) -> list[fx.Node]:
    """The backward as torch runs it (``reordering_to_mimic_autograd_engine``).

    From the first node that reads a tangent on, each node comes right after
    whichever of its backward inputs have not run yet; a node that reads no
    tangent thus runs just before its first consumer, not where the joint
    graph happens to list it. A ``deferred`` node (a matmul Inductor folds into
    the add that reads it) runs with that add, and so do the inputs it alone waits for.
    """
    position = {n: i for i, n in enumerate(graph.nodes)}
    pending = set(backward)
    tangent_users = [u for t in graph.find_nodes(op="placeholder") if adapter.is_tangent(t) for u in t.users]
    starts = [position[u] for u in tangent_users if u in pending]
    if not starts:
        return backward
    placed: list[fx.Node] = []

    def place(node: fx.Node) -> None:
        todo, batch = [node], []
        while todo:
            n = todo.pop()
            if n in pending:
                pending.discard(n)
                batch.append(n)
                todo.extend(n.all_input_nodes)
        placed.extend(sorted(batch, key=position.__getitem__))

    first = min(starts)
    for node in backward:
        if position[node] < first and node.target is torch.ops.aten.copy_.default:
            place(node)
    for node in backward:
        if position[node] >= first and node not in deferred:
            place(node)
    return placed + [n for n in backward if n in pending]


def is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def storage_owner(node: fx.Node, costs: dict[str, NodeCost], by_name: dict[str, fx.Node]) -> fx.Node:
    """Follow view chains to the node that owns the storage."""
    while (cost := costs.get(node.name)) is not None and cost.alias_of is not None:
        node = by_name[cost.alias_of]
    return node


def output_nodes(graph: fx.Graph) -> set[fx.Node]:
    out = graph.find_nodes(op="output")[0]
    return {a for a in out.all_input_nodes}


def need_intervals(order: Order) -> tuple[dict[fx.Node, int], dict[fx.Node, int]]:
    """Earliest and latest backward step that may need each forward node.

    A node v may be needed at its own backward uses, and wherever a forward
    user w may be recomputed: ``first[v]`` is the earliest of these over
    every chain of users (the plan's actual start, ``solvers.model.exact_starts``,
    is never earlier); ``last[v]`` bounds the latest step it is read. A recomputation
    counts at the step before its reader (``recompute_step``), so an operand read only to
    recompute a user is not counted at the step that reads the user.
    """
    first: dict[fx.Node, int] = {}
    last: dict[fx.Node, int] = {}
    latest_start: dict[fx.Node, int] = {}  # the latest a recomputation of v can happen
    for node in reversed(order.forward_steps):
        direct = uses(node, order, forward=False)
        users = [u for u in node.users if u in first]
        direct_start = recompute_step(order, min(direct)) if direct else None
        starts = ([direct_start] if direct else []) + [first[u] for u in users]
        if not starts:
            continue
        first[node] = min(starts)
        latest_start[node] = direct_start if direct else max(latest_start[u] for u in users)
        last[node] = max(direct + [latest_start[u] for u in users])
    return first, last


def recompute_step(order: Order, step: int) -> int:
    """The step a recomputation for a backward reader at ``step`` counts at: the one before.
    The partitioner places a recomputed chain just before its first reader, so its
    intermediates are freed before that reader's outputs are allocated; counted at the reader's
    own step, a block's recomputed chain sat beside the outputs of the attention backward that
    reads its end. Never before the backward's first step: the backward graph begins there."""
    return max(step - 1, len(order.forward_steps))


def fold_aliases(values: dict[fx.Node, dict], owners: dict[fx.Node, fx.Node]) -> None:
    """A storage lives as long as any of its aliases: widen the owner's intervals."""
    for node, owner in owners.items():
        if node is owner or owner not in values:
            continue
        alias, base = values[node], values[owner]
        if base["kind"] is Kind.BACKWARD or alias["kind"] is Kind.FORWARD:
            base["last_use"] = max(base["last_use"], alias["last_use"])
        if alias["kind"] is Kind.BACKWARD and base["kind"] is Kind.FORWARD:
            widen_need(base, alias["produced"], alias["last_use"])
        elif alias.get("need_end") is not None:
            widen_need(base, alias["need_start"], alias["need_end"])


def verdict_of(node: fx.Node, policy: Policy, costs: dict[str, NodeCost]) -> Verdict | None:
    """What ``policy`` pins for ``node``; an output of a multi-output op follows its op.
    Views are never pinned: their base's decision is theirs."""
    parent = multi_output_parent(node)
    if parent is not None and parent.name in costs:
        return verdict_of(parent, policy, costs)
    if costs[node.name].kind == "view":
        return None
    return policy(node)


def reads_any(node: fx.Node, names: set[str], costs: dict[str, NodeCost]) -> bool:
    """Whether ``node`` (or the multi-output op it is an element of) reads one of
    ``names``, directly or through views."""
    todo = list((multi_output_parent(node) or node).all_input_nodes)
    while todo:
        arg = todo.pop()
        if arg.name in names:
            return True
        if arg.name in costs and costs[arg.name].kind == "view":
            todo += arg.all_input_nodes
    return False


def ban_reading_written_inputs(fields: dict[fx.Node, dict], written: set[str], costs: dict[str, NodeCost]) -> None:
    """A value computed from a buffer the forward updates cannot be recomputed:
    by the backward the buffer holds its new value."""
    if not written:
        return
    for node, field in fields.items():
        if field.get("kind") is Kind.FORWARD and not field["recompute_ban"] and reads_any(node, written, costs):
            field["recompute_ban"] = "reads a buffer the forward updates in place"
            # correctness over a policy's wish to recompute it: it must be kept
            field["savable"] = is_tensor(node) and costs[node.name].kind != "view"


def uses(node: fx.Node, order: Order, *, forward: bool) -> list[int]:
    return [order.step_of[u] for u in node.users if u in order.step_of and (u in order.forward) == forward]


def cost_fields(cost: NodeCost, peaks: DevicePeaks, fusion: bool) -> dict:
    """Objective terms: what recomputing, and what keeping, adds to the step."""
    fused = fusion and cost.kind == "pointwise"
    return {
        "op": "",
        "seconds": cost.seconds,
        "flops": cost.flops,
        "recompute_seconds": cost.seconds * (FUSED_RECOMPUTE_FRACTION if fused else 1.0),
        # a fused value is never written unless kept: keeping it costs a write and a read
        "save_seconds": 2 * cost.bytes / peaks.bytes_per_s if fused else 0.0,
    }


def step_workspace(node: fx.Node, cost: NodeCost, fusion: bool) -> int:
    """Scratch bytes the op holds while it runs. Under Inductor none for the ops it generates
    code for (pointwise, reductions, its random prims): their only memory is the buffers the
    wrapper allocates, which the model counts. Measured alone they may allocate temporaries
    (a bool mask times a float tensor makes a float copy of the mask)."""
    # (the random prims by their packet: the node's target is an overload of one)
    packet = getattr(node.target, "overloadpacket", node.target)
    generated = cost.kind in GENERATED_KINDS or packet in adapter.inductor_random_prims()
    return 0 if fusion and generated else cost.workspace


def forward_fields(node: fx.Node, costs: dict[str, NodeCost], order: Order, outputs: set[fx.Node],
                   need: tuple[dict, dict], policy: Policy) -> dict:
    cost = costs[node.name]
    verdict = verdict_of(node, policy, costs)
    fwd_uses = uses(node, order, forward=True)
    bwd_uses = uses(node, order, forward=False)
    step = order.step_of[node]
    last_use = order.last if node in outputs else max(fwd_uses, default=step)
    first, last = need
    return {
        "kind": Kind.FORWARD,
        "last_use": last_use,
        "need_start": first.get(node),
        "need_end": last.get(node),
        "direct_need": bool(bwd_uses),
        "direct_start": recompute_step(order, min(bwd_uses)) if bwd_uses else None,
        # sizes (SymInt nodes of a dynamic-shape graph) are handed to the backward for free
        "operands": tuple(a.name for a in node.all_input_nodes if a in order.forward and holds_tensors(a)),
        "recompute_ban": verdict.reason if verdict is not None and verdict.pin is Pin.MUST_SAVE else None,
        "savable": is_tensor(node) and cost.kind != "view"
        and not (verdict is not None and verdict.pin is Pin.MUST_RECOMPUTE),
    }


def backward_fields(node: fx.Node, order: Order, outputs: set[fx.Node]) -> dict:
    step = order.step_of[node]
    last_use = order.last if node in outputs else max(uses(node, order, forward=False), default=step)
    return {"kind": Kind.BACKWARD, "last_use": last_use}


def holds_tensors(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) or (isinstance(val, (tuple, list)) and bool(val))


def problem_nodes(graph: fx.Graph, order: Order) -> Iterable[fx.Node]:
    """Nodes that hold tensors (or tuples of them) in step order."""
    return (node for node in order.steps if holds_tensors(node))


def placeholder_value(node: fx.Node, cost: NodeCost, order: Order) -> Value:
    """Graph inputs live throughout; the gradients of the outputs arrive with the backward."""
    if adapter.is_tangent(node):
        first_backward = len(order.forward)
        return Value(name=node.name, kind=Kind.BACKWARD, bytes=cost.bytes, produced=min(first_backward, order.last),
                     last_use=order.last, op="tangent", category="gradient")
    return Value(name=node.name, kind=Kind.INPUT, bytes=cost.bytes, produced=0, last_use=order.last, op="input",
                 category="input")


def build_problem(graph: fx.Graph, node_info: adapter.NodeInfo, costs: dict[str, NodeCost], *,
                  fusion: bool = False, policy: Policy | None = None) -> Problem:
    """The whole joint graph as plain data for the solvers.

    With ``fusion`` (Inductor compiles the graphs), values Inductor never
    materializes hold no bytes outside the keep/recompute decisions. ``policy`` pins
    decisions (after ``policies.SAFETY``, which always applies).
    """
    policy = with_safety(policy)
    classify(graph)
    order = fixed_order(graph, node_info, inductor=fusion)
    outputs = output_nodes(graph)
    peaks = DevicePeaks.for_device(device_of(graph))
    need = need_intervals(order)
    by_name = {n.name: n for n in graph.nodes}
    blocks = repeated_blocks(order.forward)
    fields: dict[fx.Node, dict] = {}
    for node in problem_nodes(graph, order):
        cost = costs[node.name]
        base = {"name": node.name, "bytes": cost.bytes, "produced": produced_at(node, order), **cost_fields(cost, peaks, fusion)}
        base["op"], base["category"] = str(node.target), node.meta[CATEGORY]
        extra = {**forward_fields(node, costs, order, outputs, need, policy), "block": blocks.get(node, "")} \
            if node in order.forward else backward_fields(node, order, outputs)
        fields[node] = {**base, **extra}
    ban_reading_written_inputs(fields, adapter.mutated_inputs(graph), costs)
    owners = {n: storage_owner(n, costs, by_name) for n in fields}
    if fusion:  # before the aliases fold: what inlined kernels read through a view is its base's
        inlined, anywhere = fusion_sets(order, costs, outputs, device_of(graph).type == "cpu")
        read_where_inlined(fields, inlined, early_inlining(order, costs, outputs, inlined))
    fold_aliases(fields, owners)
    if fusion:
        for node in fields:
            apply_fusion(node, fields[node], inlined, anywhere, order)
        for node, read in reused_in_place(order, fields, costs, inlined).items():
            end_before(fields[read], order.step_of[node])
    inputs = [placeholder_value(n, costs[n.name], order) for n in graph.find_nodes(op="placeholder") if n.name in costs]
    values = inputs + [Value(**f) for f in fields.values()]
    workspace = tuple(step_workspace(n, costs[n.name], fusion) if n.name in costs else 0 for n in order.steps)
    return Problem(values=tuple(values), num_forward_steps=len(order.forward), num_steps=len(order.steps),
                   workspace=workspace, step_names=tuple(n.name for n in order.steps),
                   meta={"device": str(device_of(graph))})
