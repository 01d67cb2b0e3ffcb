"""One classification of ops (passes/capture/taxonomy.py), written to node.meta and read everywhere above."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from remat.passes.capture import taxonomy


def categories(fn, *args) -> dict[str, str]:  # type: ignore[no-untyped-def]
    gm = make_fx(fn)(*args)
    taxonomy.classify(gm.graph)
    return {str(n.target).split(".")[1] if n.op == "call_function" and str(n.target).count(".") == 2 else n.name:
            n.meta[taxonomy.CATEGORY] for n in gm.graph.nodes if n.op != "output"}


def test_each_kind_of_op_gets_its_category() -> None:
    def step(x, w, b):  # type: ignore[no-untyped-def]
        h = F.layer_norm(x @ w, (8,))
        a = F.scaled_dot_product_attention(h[None], h[None], h[None])[0]
        return (a.softmax(-1).relu().view(-1).sum() + F.dropout(b, 0.0, training=True).sum(),
                torch.max(h, dim=0))

    got = categories(step, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8))
    assert got["x_1"] == "input"
    assert got["mm"] == "matmul" and got["native_layer_norm"] == "normalization"
    assert got["_softmax"] == "softmax" and got["relu"] == "pointwise" and got["sum"] == "reduction"
    assert got["view"] == "view"
    assert got["bmm"] == "matmul"  # make_fx decomposes attention; Inductor's graphs keep the fused op:
    assert taxonomy.op_category(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default) == "attention"
    assert got["max"] == "reduction"  # a multi-output op; its getitems take its category


def test_dropout_is_random_only_with_a_nonzero_probability() -> None:
    def masked(x, p):  # type: ignore[no-untyped-def]
        return torch.ops.aten.native_dropout(x, p, True)[0]

    gm = make_fx(lambda x: masked(x, 0.5))(torch.randn(4))
    taxonomy.classify(gm.graph)
    dropout = [n for n in gm.graph.nodes if "native_dropout" in str(n.target)]
    assert dropout and dropout[0].meta[taxonomy.CATEGORY] == "random"
    getitems = [n for n in gm.graph.nodes if n.op == "call_function" and n.args and n.args[0] is dropout[0]]
    assert getitems and all(n.meta[taxonomy.CATEGORY] == "random" for n in getitems)


def test_selective_checkpointing_keeps_matmul_class_outputs_only() -> None:
    aten = torch.ops.aten
    assert taxonomy.saved_by_selective(aten.mm.default) and taxonomy.saved_by_selective(aten.convolution.default)
    assert taxonomy.saved_by_selective(aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert not taxonomy.saved_by_selective(aten.relu.default) and not taxonomy.saved_by_selective(aten.sum.default)


def test_the_profiles_kind_and_the_reports_category_agree_on_inductors_pointwise_ops() -> None:
    """Inductor decomposes ``_softmax_backward_data`` into ``prims.fma``: one op, one answer. Were
    it "other" to the profiler, the temporary it allocates when measured alone would be counted as
    scratch of a kernel Inductor writes no buffer for (T5's account was 512 KiB high for two)."""
    from torch._inductor.decomposition import select_decomp_table

    def softmax_backward(grad, out):  # type: ignore[no-untyped-def]
        return torch.ops.aten._softmax_backward_data(grad, out, -1, torch.float32)

    gm = make_fx(softmax_backward, decomposition_table=select_decomp_table())(torch.randn(4, 8), torch.randn(4, 8))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert any(n.target is torch.ops.prims.fma.default for n in nodes)
    for node in nodes:
        if taxonomy.node_category(node) == "pointwise":
            assert taxonomy.node_kind(node) == "pointwise", node.target
