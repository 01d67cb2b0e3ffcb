"""Repeated blocks read from dynamo's module stacks (passes/capture/taxonomy.py)."""

from __future__ import annotations

import torch.fx as fx

from remat.passes.capture.taxonomy import indexed_module, repeated_blocks


def node_in(graph: fx.Graph, *stack: tuple[str, str]) -> fx.Node:
    """A node whose module stack is ``stack`` (outermost first), as dynamo records it."""
    node = graph.placeholder(f"x{len(graph.nodes)}")
    node.meta["nn_module_stack"] = {f"key{i}": (path, kind) for i, (path, kind) in enumerate(stack)}
    return node


def test_the_outermost_indexed_module_is_the_block() -> None:
    graph = fx.Graph()
    node = node_in(graph, ("L['self'].model.layers.3", "Block"), ("L['self'].model.layers.3.mlp.0", "Linear"))
    assert indexed_module(node) == ("model.layers.3", "Block")
    assert indexed_module(node_in(graph, ("L['self'].lm_head", "Linear"))) is None
    assert indexed_module(node_in(graph)) is None


def test_blocks_are_indexed_modules_with_a_sibling_of_their_class() -> None:
    graph = fx.Graph()
    nodes = {
        "block0": node_in(graph, ("L['self'].blocks.0", "Block")),
        "block1": node_in(graph, ("L['self'].blocks.1", "Block"), ("L['self'].blocks.1.attn", "Attention")),
        "conv": node_in(graph, ("L['self'].stem.0", "Conv2d")),  # a stem of distinct layers: no blocks
        "norm": node_in(graph, ("L['self'].stem.1", "BatchNorm2d")),
        "top0": node_in(graph, ("L['self'].0", "Layer")),  # a top-level Sequential of layers
        "top1": node_in(graph, ("L['self'].1", "Layer")),
        "head": node_in(graph, ("L['self'].head", "Linear")),
    }
    blocks = repeated_blocks(nodes.values())
    assert {name: blocks.get(node, "") for name, node in nodes.items()} == {
        "block0": "blocks.0", "block1": "blocks.1", "conv": "", "norm": "", "top0": "0", "top1": "1", "head": ""}
