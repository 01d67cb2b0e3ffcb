"""Inductor's kernel order, kept where remat's plan put each computation.

remat plans with the partitioned FX graphs' order: a recomputed value comes to life where
the backward first needs it, and a kept one dies after its last use. Inductor's scheduler
fuses kernels and places each fused kernel where its *first* part was, then sorts
topologically, so everything the fused kernel needs moves up with it. On a 4-layer GPT
(d=256, seq 128, CPU) it fused a kernel of layer 1's backward (FX position 140) with
layer 0's LayerNorm backward (157): layer 0's recomputed fc1 matmul (150) then ran before
the fc2 weight-gradient matmul (144) that frees a kept 2 MiB activation, and the
smallest-peak plan's program peaked 5 % above the plan (33.23 MiB against 31.56).

``FusedAtLastPart`` places each (fused) kernel where its *last* part was, and what it needs
just before it: a valid order (every kernel after its producers) that never runs a
computation earlier than the FX order had it. On that GPT the smallest feasible budget fell
to 32.23 MiB; on the explicit-softmax GPT it rose 1.4 %, and Llama-style, ViT and a conv net
were unchanged (``python -m bench.fused_order``). It runs after fusion
(``_post_fusion_custom_pass``), only while remat's graphs compile, and carries a ``uuid`` so
that Inductor's FX graph cache keys on it.

``addmm_folded`` says which matmul Inductor's post-grad patterns fold into the add that reads
it (``add(mm(a, b), c)`` becomes ``addmm(c, a, b)``, placed at the add): that matmul runs at the
add, not where the FX graph lists it, and its inputs live until then. On a GPT-2 with tied
embeddings the LM head's weight gradient is added to the embedding's at the end of the backward,
so the logits gradient stayed alive through the whole backward (the smallest-peak plan's program
peaked 13 % above the plan). Where that holds more than it saves, remat keeps the two apart
(``unfold``: the add becomes ``prims.add``, the same kernel, which the pattern does not match);
elsewhere its model places the matmul where Inductor will (``passes/modeling/problem.py``).

``LocalFusion`` keeps fusions from undoing the same order: no fusion spans an extern
kernel, since the fused kernel (at its last part) would carry the earlier part's outputs, or
its computation and what it reads, past it. Installed through Inductor's out-of-tree choices
hook, for remat's graphs only.
"""

from __future__ import annotations

import bisect
import contextlib
import weakref
from collections.abc import Collection, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._inductor import config as inductor_config
from torch._inductor import custom_graph_pass
from torch._inductor import utils as inductor_utils
from torch._inductor.virtualized import V
from torch._prims_common import is_expandable_to

try:
    from torch._inductor.choices import InductorChoices
except ImportError:  # a torch without out-of-tree fusion choices: Inductor's own
    InductorChoices = None

__all__ = ["FusedAtLastPart", "LocalFusion", "addmm_folded", "can_unfold", "fusion_choices",
           "has_fusion_choices", "order_settings", "unfold"]

# torch 2.13 checks a scheduler pass against CustomSchedulerPass for its cache key; earlier
# versions against CustomGraphPass (the same two methods, a graph in place of the nodes).
_PASS_BASE: Any = getattr(custom_graph_pass, "CustomSchedulerPass", custom_graph_pass.CustomGraphPass)
_SETTING = "_post_fusion_custom_pass"


class FusedAtLastPart(_PASS_BASE):  # type: ignore[misc, valid-type]
    """Scheduler nodes in the order of their last part (``max_order``), each after its producers."""

    def __call__(self, nodes: list[Any]) -> list[Any]:
        if not all(hasattr(node, "max_order") for node in nodes):  # a torch without it: Inductor's order
            return nodes
        producer = {name: node for node in nodes for name in node.get_buffer_names()}
        placed: set[int] = set()
        order: list[Any] = []

        def place(node: Any) -> None:
            # iterative depth-first: a deep chain of producers must not hit the recursion limit
            stack = [(node, _dependencies(node))]
            placed.add(id(node))
            while stack:
                current, deps = stack[-1]
                for dep in deps:
                    before = producer.get(dep.name)
                    if before is not None and id(before) not in placed:
                        placed.add(id(before))
                        stack.append((before, _dependencies(before)))
                        break
                else:
                    stack.pop()
                    order.append(current)

        for node in sorted(nodes, key=lambda n: n.max_order):
            if id(node) not in placed:
                place(node)
        return order

    def uuid(self) -> str:
        # the FX graph cache keys on this: it names LocalFusion's rule too (".2" horizontal
        # fusions, ".3" vertical ones as well)
        return "remat.FusedAtLastPart.3"


def _dependencies(node: Any) -> Iterator[Any]:
    """A node's unmet dependencies in a stable order (by buffer name, as Inductor's own sort)."""
    return iter(sorted(node.unmet_dependencies, key=lambda dep: dep.name))


def order_settings() -> dict[str, Any]:
    """The Inductor settings that install the pass (none where this torch has no such hook)."""
    return {_SETTING: FusedAtLastPart()} if hasattr(inductor_config, _SETTING) else {}


class LocalFusion(InductorChoices or object):  # type: ignore[misc]
    """Inductor's fusion choices, except that no fusion spans an extern kernel (a matmul, a
    convolution, attention) that lies between its parts in the FX order.

    The fused kernel runs where its last part was, so such a fusion delays the earlier part's
    outputs past the extern kernel: on a Llama-style model (SwiGLU) Inductor fused the
    recomputed ``silu(gate) * up``, which the down projection's weight gradient reads, with the
    gate and up gradients computed after the matmul that makes the incoming gradient, so three
    hidden-size buffers were born together and the smallest-peak plan's program peaked 33 %
    above the plan. A vertical fusion (one part reads the other's output) across an extern
    kernel likewise moves the producer's computation past it, with every buffer it reads: the
    Llama-style model's smallest feasible budget (2 layers, d=128, seq 256, CPU) was 3.4 %
    lower with the rule on both kinds than on horizontal fusions alone. Fusions of neighbours
    are Inductor's as before.
    """

    @staticmethod
    def can_fuse_vertical(scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
        if _spans_extern_kernel(scheduler, node1, node2):
            return False
        return InductorChoices.can_fuse_vertical(scheduler, node1, node2, shared_data_score)

    @staticmethod
    def can_fuse_horizontal(scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
        if _spans_extern_kernel(scheduler, node1, node2):
            return False
        return InductorChoices.can_fuse_horizontal(scheduler, node1, node2, shared_data_score)


_EXTERN_ORDERS: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


def _spans_extern_kernel(scheduler: Any, node1: Any, node2: Any) -> bool:
    """Whether an extern kernel's FX position lies strictly between the two nodes' spans."""
    if not all(hasattr(n, "min_order") for n in (node1, node2)):
        return False
    low = min(node1.max_order, node2.max_order)
    high = max(node1.min_order, node2.min_order)
    if high - low < 2:
        return False
    if scheduler not in _EXTERN_ORDERS:  # extern kernels never fuse: their positions stay put
        _EXTERN_ORDERS[scheduler] = sorted(n.min_order for n in scheduler.nodes if n.is_extern())
    orders = _EXTERN_ORDERS[scheduler]
    i = bisect.bisect_right(orders, low)
    return i < len(orders) and orders[i] < high


def has_fusion_choices() -> bool:
    """Whether this torch lets code outside it decide fusions."""
    return InductorChoices is not None and hasattr(V, "set_choices_handler") \
        and hasattr(InductorChoices, "can_fuse_horizontal")


@contextlib.contextmanager
def fusion_choices(choices: type | None) -> Iterator[None]:
    """Inductor decides fusions with ``choices`` in the block (with its own where this torch
    has no such hook, or ``choices`` is None)."""
    if choices is None or not has_fusion_choices():
        yield
        return
    with V.set_choices_handler(choices()):  # installed on entry, the prior handler restored on exit
        yield


def addmm_folded(add: fx.Node) -> fx.Node | None:
    """The ``mm`` that Inductor's post-grad pattern (``addmm`` in ``fx_passes/post_grad.py``,
    torch 2.11-2.14) folds into ``add``, so that it runs where ``add`` is; None if it folds none.

    The rule is torch's: ``add(mm(a, b), c)`` or ``add(c, mm(a, b))``, the matmul read by the add
    alone, ``c`` a tensor that broadcasts to the product, all three of one dtype; on a GPU not
    where every use of the sum is pointwise (there Inductor prefers the pointwise add). The
    matcher reads no keyword of the add (an ``alpha`` included)."""
    if getattr(add.target, "overloadpacket", None) is not torch.ops.aten.add or len(add.args) != 2:
        return None
    for mm, inp in (add.args, reversed(add.args)):
        if _folds(mm, inp):
            return mm
    return None


def can_unfold(add: fx.Node) -> bool:
    """Whether :func:`unfold` can keep Inductor from folding ``add``'s matmul: a plain add of two
    tensors of one shape, which ``prims.add`` computes alike and the pattern does not match."""
    mm = addmm_folded(add)
    if mm is None or add.target is not torch.ops.aten.add.Tensor or add.kwargs:
        return False
    inp = add.args[1] if add.args[0] is mm else add.args[0]
    return tuple(inp.meta["val"].shape) == tuple(mm.meta["val"].shape)


def unfold(graph: fx.Graph, adds: Collection[str]) -> int:
    """Make each add named in ``adds`` that :func:`can_unfold` a ``prims.add`` (the same
    kernel), so that its matmul runs where the graph lists it; how many were changed."""
    changed = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.name in adds and can_unfold(node):
            node.target = torch.ops.prims.add.default
            changed += 1
    return changed


def _folds(mm: Any, inp: Any) -> bool:
    if not (isinstance(mm, fx.Node) and mm.target is torch.ops.aten.mm.default and len(mm.users) == 1):
        return False
    vals = [getattr(n, "meta", {}).get("val") for n in (inp, *mm.args)]
    if not (isinstance(inp, fx.Node) and all(isinstance(v, torch.Tensor) for v in vals)):
        return False
    c, a, b = vals
    if not is_expandable_to(c.shape, (a.shape[0], b.shape[1])) or not c.dtype == a.dtype == b.dtype:
        return False
    add = next(iter(mm.users))
    # the GPU exception is 2.13's; versions differ in it (bias-like addends, reductions too): where
    # they do, the compiled account, not this order, is what the budget is held to
    prefers_pointwise = getattr(inductor_utils, "is_gpu", lambda _: False)(c.device.type) and all(
        inductor_utils.is_pointwise_use(use) for use in add.users)
    return not prefers_pointwise
