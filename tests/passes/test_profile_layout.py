"""Convolutions are measured in the layout Inductor gives them (passes/costs/profile.py, CHANNELS_LAST)."""

from __future__ import annotations

import torch
from torch._functorch.aot_autograd import aot_function

from remat.passes.costs import profile


def joint_graph_of_a_convolution() -> torch.fx.Graph:
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm.graph)
        return gm

    x, w = torch.randn(8, 32, 32, 32, requires_grad=True), torch.randn(32, 32, 3, 3, requires_grad=True)
    f = aot_function(lambda a, b: torch.nn.functional.conv2d(a, b, padding=1).relu(), fw_compiler=keep,
                     bw_compiler=keep)
    f(x, w).sum().backward()
    return graphs[0]


def test_under_inductor_a_cpu_convolution_is_measured_channels_last() -> None:
    graph = joint_graph_of_a_convolution()
    contiguous = profile.profile_graph(graph, cache=profile.TimingCache())
    conv = next(n for n in graph.nodes if n.target is torch.ops.aten.convolution.default)
    assert conv.meta[profile.CHANNELS_LAST] is False
    laid_out = profile.profile_graph(graph, cache=profile.TimingCache(), inductor=True)
    assert conv.meta[profile.CHANNELS_LAST]
    assert profile.cache_key(conv)[-1] == "channels_last"  # never mixed up with the contiguous measurement
    # contiguous, mkldnn reorders into its own layout: about the output's 1 MiB again
    assert contiguous[conv.name].workspace >= 512 * 1024
    assert laid_out[conv.name].workspace < contiguous[conv.name].workspace // 4
