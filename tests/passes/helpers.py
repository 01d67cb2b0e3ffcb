"""Tiny joint graphs for the FX-pass unit tests, made the way remat receives them.

Two sources:

- ``traced_joint``: a hand-written joint function ``fn(primals..., tangents...)``
  traced to ATen with fake tensors (``make_fx``), classified by torch's own
  partitioner (``classify_nodes``): the test decides the exact graph, node order
  included, and can work out every expected number by hand.
- ``capture``: a real model through dynamo, AOTAutograd and torch's min-cut
  partitioner (``passes/eager_compiler.compile_eager``), exactly as remat's
  backend sees it: the joint graph and node info handed to
  ``choose_saved_values_set``, and the forward and backward graphs torch built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._functorch.partitioners import classify_nodes  # the partitioner's own NodeInfo builder
from torch.fx.experimental.proxy_tensor import make_fx

from remat.passes import torch_adapter as adapter
from remat.passes.program.eager_compiler import compile_eager
from remat.passes.costs.profile import NodeCost, profile_graph

aten = torch.ops.aten
F32 = 4  # bytes per float32 element


def traced_joint(fn: Callable[..., Any], *example: torch.Tensor,
                 num_fwd_outputs: int) -> tuple[fx.GraphModule, adapter.NodeInfo]:
    """``fn`` traced op by op (placeholders are named after its arguments plus ``_1``),
    and torch's classification of its nodes (the first ``num_fwd_outputs`` outputs are
    the forward's)."""
    gm = make_fx(fn, tracing_mode="fake")(*example)
    return gm, classify_nodes(gm, [], num_fwd_outputs)


def analytic_costs(graph: fx.Graph) -> dict[str, NodeCost]:
    """Costs without running anything: bytes and kinds exact, times from FLOPs and bytes over device peaks."""
    return profile_graph(graph, mode="analytic")


@dataclass
class Captured:
    joint: fx.Graph | None = None
    info: Any = None
    saved: list[str] = field(default_factory=list)
    forward: fx.GraphModule | None = None
    backward: fx.GraphModule | None = None


def capture(model: torch.nn.Module, *inputs: torch.Tensor, run_backward: bool = True) -> Captured:
    """Compile ``model`` the way remat's backend does (``compiler="eager"``), with torch's
    own min-cut choice of saved values, and keep what the partitioner saw and built.

    The backward graph is built at the first backward call; ``run_backward=False`` stops
    after the forward (for models whose backward torch's own plan cannot run)."""
    got = Captured()

    def choose(joint: fx.Graph, info: Any) -> list[fx.Node]:
        got.joint, got.info = joint, info
        saved = adapter.min_cut_saved_values(joint, info)
        got.saved = [n.name for n in saved]
        return saved

    def on_graph(gm: fx.GraphModule, kind: str) -> None:
        setattr(got, kind, gm)

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        with adapter.saved_values_chooser(choose):
            return compile_eager(gm, example_inputs, on_graph=on_graph)

    out = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    if run_backward:
        out.sum().backward()
    assert got.joint is not None, "no joint graph was partitioned"
    return got


def call_names(graph: fx.Graph) -> list[str]:
    return [n.name for n in graph.nodes if n.op == "call_function"]


class Chain(torch.nn.Module):
    """``layers`` tanh layers, activations far larger than the weights: recomputing a layer from an
    earlier kept one lowers the peak."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.sum()


def dynamo_graph(model: torch.nn.Module, *inputs: torch.Tensor) -> tuple[fx.GraphModule, list]:
    """The one graph dynamo captures of ``model(*inputs)`` and its example inputs (nothing planned)."""
    graphs: list = []
    torch._dynamo.reset()
    torch.compile(model, backend=lambda gm, example: graphs.append((gm, example)) or gm)(*inputs)
    (gm, example), = graphs
    return gm, example
