"""What each op is, decided once: the category every layer above reads.

:func:`classify` writes ``node.meta["remat_category"]`` on every node of a joint
graph; the problem pass copies it into ``Value.category``, and the report, the
bench's selective-checkpointing peer and the CLI read it from there. Categories:
input, gradient, matmul, attention, convolution, normalization, softmax,
embedding, loss, random, reduction, pointwise, view, multi-output, other.
"""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.fx as fx

from .. import torch_adapter as adapter

CATEGORY = "remat_category"
_aten = torch.ops.aten
# Reductions: Inductor fuses pointwise producers into their kernels.
REDUCTIONS = frozenset({_aten.sum, _aten.mean, _aten.amax, _aten.amin, _aten.prod, _aten.var, _aten.var_mean,
                        _aten.max, _aten.min, _aten.argmax, _aten.argmin, _aten.any, _aten.all, _aten.logsumexp})

MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_int_mm"})
# by a part of the op's name, first match wins
NAMED = (("scaled_dot_product", "attention"), ("flash_attention", "attention"),
         ("efficient_attention", "attention"), ("convolution", "convolution"), ("norm", "normalization"),
         ("softmax", "softmax"), ("embedding", "embedding"), ("loss", "loss"))
TAGGED = ((torch.Tag.nondeterministic_seeded, "random"), (torch.Tag.reduction, "reduction"),
          (torch.Tag.pointwise, "pointwise"))
VIEWS = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
                   "slice", "select", "unsqueeze", "squeeze", "as_strided", "alias", "split", "split_with_sizes",
                   "unbind", "chunk", "narrow", "unfold", "diagonal", "detach", "view_as_real", "view_as_complex"})
# What Megatron-style selective checkpointing keeps: the matmul-class outputs.
SAVED_BY_SELECTIVE = frozenset({"matmul", "attention", "convolution"})


def node_kind(node: fx.Node) -> str:
    if node.op == "placeholder":
        return "input"
    if node.target is operator.getitem:
        return "getitem"
    if is_random(node):
        return "random"
    if is_alias(node):
        return "view"
    if adapter.OP_TYPES.is_compute_intensive(node):
        return "matmul"
    if isinstance(node.meta.get("val"), (tuple, list)):
        return "tuple"
    if adapter.aten_packet(node) in REDUCTIONS:
        return "reduction"
    if adapter.inductor_generates_pointwise(node):
        return "pointwise"
    return "other"


def is_random(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    tags = getattr(node.target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags:
        return dropout_probability(node) != 0
    return node.target in adapter.random_op_targets() or adapter.OP_TYPES.is_random(node)


def dropout_probability(node: fx.Node) -> float | None:
    """The drop probability of ops that are random only when it is nonzero: ``dropout_p`` (SDPA
    and other attention kernels) or, for dropout itself, ``p``. None for other ops."""
    schema = adapter.op_schema(node)
    names = [a.name for a in schema.arguments] if schema is not None else []
    name = "dropout_p" if "dropout_p" in names else "p" if "dropout" in op_name(node.target) and "p" in names else None
    if name is None:
        return None
    if name in node.kwargs:
        return node.kwargs[name]
    index = names.index(name)
    return node.args[index] if index < len(node.args) else 0.0


def is_alias(node: fx.Node) -> bool:
    """Whether the node's output shares its first tensor argument's storage."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    schema = adapter.op_schema(node)
    if schema is not None and any(r.alias_info is not None for r in schema.returns):
        return True
    return adapter.OP_TYPES.is_view(node)


def op_name(target: object) -> str:
    """``aten.addmm.default`` -> ``addmm``; other targets by their name."""
    text = str(target)
    return text.split(".")[1] if text.count(".") == 2 else getattr(target, "__name__", text)


def op_category(target: object) -> str:
    """The category of an op (an ``OpOverload`` or its packet) by its name and torch's tags."""
    name = op_name(target)
    if name in MATMULS:
        return "matmul"
    for part, category in NAMED:
        if part in name:
            return category
    tags = getattr(target, "tags", ())
    for tag, category in TAGGED:
        if tag in tags and category != "random":  # random by the node (is_random): dropout p=0 is not
            return category
    return "view" if name in VIEWS else "other"


def node_category(node: fx.Node) -> str:
    """The category of one node; an element of a multi-output op takes its op's."""
    if node.op == "placeholder":
        return "gradient" if adapter.is_tangent(node) else "input"
    if node.op != "call_function":
        return "other"
    if node.target is operator.getitem:
        source = node.args[0]
        return node_category(source) if isinstance(source, fx.Node) else "multi-output"
    if is_random(node):  # before the name: SDPA with dropout is random, without it attention
        return "random"
    if adapter.is_collective(node):
        return "collective"
    return op_category(node.target)


def indexed_module(node: fx.Node) -> tuple[str, str] | None:
    """(path, type) of the outermost module with an index that ran ``node`` (dynamo records
    each forward node's module stack, outermost first): ``L['self'].model.layers.3.mlp`` gives
    ``("model.layers.3", <its class>)``; None where no indexed module ran it."""
    for path, *kind in (node.meta.get("nn_module_stack") or {}).values():
        names = [name for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\d+", str(path))
                 if name not in ("L", "self", "_modules")]
        index = next((i for i, name in enumerate(names) if name.isdigit()), None)
        if index is not None:
            return ".".join(names[:index + 1]), str(kind[0]) if kind else ""
    return None


def repeated_blocks(nodes: Iterable[fx.Node]) -> dict[fx.Node, str]:
    """The repeated block of each node that ran in one: an indexed module (a layer of a
    ``ModuleList`` or ``Sequential``) with a sibling of its class in the same list. A stem of
    distinct layers (conv, norm, activation) is no block; the embedding and the loss are in none."""
    found = {node: indexed_module(node) for node in nodes}
    siblings = defaultdict(set)  # (the list's path, class) -> the indexed modules in it
    for path, kind in filter(None, found.values()):
        siblings[(path.rpartition(".")[0], kind)].add(path)
    return {node: module[0] for node, module in found.items()
            if module is not None and len(siblings[(module[0].rpartition(".")[0], module[1])]) > 1}


def classify(graph: fx.Graph) -> None:
    """Write each node's category to ``node.meta["remat_category"]``."""
    for node in graph.nodes:
        node.meta[CATEGORY] = node_category(node)


def saved_by_selective(target: object) -> bool:
    """Whether Megatron-style selective checkpointing keeps this op's output."""
    return op_category(target) in SAVED_BY_SELECTIVE
