"""Fusion (passes/modeling/fusion.py): the Inductor realization rule remat models.

A pointwise value whose readers are all pointwise ops or reductions of its own graph is
computed inside their kernels and never allocated, unless Inductor's reuse heuristic
(``StorageBox.should_realize_on_reuse``) writes it: several readers and a body over
Inductor's limit of buffer reads or ops (``torch_adapter.realize_thresholds``), or, on the CPU, a
heavy op in it; or a body over its limit of accumulated reads whatever its readers.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from torch._inductor import config as inductor_config
from torch._inductor import ir as inductor_ir
from torch.fx.experimental.proxy_tensor import make_fx

from remat import solvers
from remat.passes.modeling import fusion
from remat.passes.modeling import problem as P
from remat.passes import torch_adapter as adapter
from remat.passes.modeling.fusion import inlined_values
from remat.passes.modeling.problem import build_problem, output_nodes

from .helpers import aten, analytic_costs, traced_joint


def inlined(fn, *example: torch.Tensor, cpu: bool = True) -> set[str]:
    """The names ``inlined_values`` finds in the plain forward graph of ``fn``."""
    gm = make_fx(fn, tracing_mode="fake")(*example)
    steps = [n for n in gm.graph.nodes if n.op == "call_function"]
    return {n.name for n in inlined_values(steps, analytic_costs(gm.graph), output_nodes(gm.graph), cpu=cpu)}


X = torch.randn(4, 4)


def inputs(count: int) -> list[torch.Tensor]:
    """Distinct tensors: the tracer makes one placeholder per tensor object."""
    return [torch.randn(4, 4) for _ in range(count)]


def test_a_pointwise_chain_into_a_reduction_is_inlined() -> None:
    assert inlined(lambda x: aten.sum(aten.mul(aten.add(x, 1), 2)), X) == {"add", "mul"}


def test_a_value_read_by_a_matmul_or_leaving_the_graph_is_written() -> None:
    assert inlined(lambda x: aten.mm(aten.add(x, 1), x), X) == set()
    assert inlined(lambda x: aten.neg(aten.add(x, 1)), X) == {"add"}  # neg is the graph's output


def test_a_cheap_value_read_twice_is_inlined() -> None:
    def fn(x, y):
        a = aten.add(x, y)  # two readers, reads 2 buffers, 1 op
        return aten.sum(aten.mul(aten.mul(a, 2), aten.sub(a, 1)))

    assert inlined(fn, *inputs(2)) == {"add", "mul", "sub", "mul_1"}


def heavy_reused(x):
    a = aten.exp(x)
    b = aten.add(a, 1)  # one reader of exp; b itself is read twice, and carries exp in its body
    return aten.sum(aten.mul(aten.mul(b, 2), aten.sub(b, 1)))


def test_a_heavy_body_read_twice_is_written_on_the_cpu_only() -> None:
    assert inlined(heavy_reused, X, cpu=True) == {"exp", "mul", "sub", "mul_1"}
    assert inlined(heavy_reused, X, cpu=False) == {"exp", "add", "mul", "sub", "mul_1"}


def summed_inputs(count: int, readers: int):
    """The sum of ``count`` inputs as a chain of adds, whose last add has ``readers`` readers."""

    def fn(*xs):
        s = xs[0]
        for x in xs[1:]:
            s = aten.add(s, x)
        return aten.sum(aten.mul(s, 2)) if readers == 1 else aten.sum(aten.mul(aten.mul(s, 2), aten.sub(s, 1)))

    return fn


def test_read_count_threshold_for_a_value_read_twice() -> None:
    """A body reading 4 buffers (the reads limit) is inlined into two readers; one more is written."""
    four = inlined(summed_inputs(4, readers=2), *inputs(4))
    five = inlined(summed_inputs(5, readers=2), *inputs(5))
    assert adapter.realize_thresholds(cpu=True)[0] == 4  # the limit the figures above assume
    assert "add_2" in four and "add_3" not in five
    assert {"add", "add_1", "add_2"} <= five  # the chain before the last add still folds in


def test_accumulated_reads_are_written_whatever_the_readers() -> None:
    """One reader, on an accelerator: a body of 8 reads (the accumulated-reads limit) is inlined, 9 are written."""
    eight = inlined(summed_inputs(8, readers=1), *inputs(8), cpu=False)
    nine = inlined(summed_inputs(9, readers=1), *inputs(9), cpu=False)
    assert adapter.realize_thresholds(cpu=False)[2] == 8
    assert eight == {"add", "add_1", "add_2", "add_3", "add_4", "add_5", "add_6", "mul"}
    assert "add_7" not in nine and {"add_6", "mul"} <= nine


def negations(count: int):
    def fn(x):
        for _ in range(count):
            x = aten.neg(x)
        return aten.sum(aten.mul(aten.mul(x, 2), aten.sub(x, 1)))

    return fn


def test_op_count_threshold_for_a_value_read_twice() -> None:
    """On an accelerator a body of 30 ops (the ops limit), its one load included, is inlined into two
    readers: 29 negations; 30 negations (31 ops) are written."""
    assert adapter.realize_thresholds(cpu=False)[1] == 30
    assert "neg_28" in inlined(negations(29), X, cpu=False)
    assert "neg_29" not in inlined(negations(30), X, cpu=False)
    assert "neg_28" in inlined(negations(30), X, cpu=False)  # one reader: no op limit


def inductor_heavy_ops() -> set[str]:
    """The CPU heavy ops listed in Inductor's own ``should_realize_on_reuse``."""
    source = inspect.getsource(inductor_ir.StorageBox.should_realize_on_reuse)
    listed = re.search(r"heavy_ops\s*=\s*\[(.*?)\]", source, re.S)
    assert listed, "Inductor's reuse heuristic no longer lists heavy ops: update the model"
    return set(re.findall(r"\"(\w+)\"", listed.group(1)))


def test_heavy_ops_are_inductors() -> None:
    assert fusion.CPU_HEAVY_OPS == inductor_heavy_ops()


def test_reuse_thresholds_are_inductors_on_an_accelerator() -> None:
    reads, ops, acc_reads = adapter.realize_thresholds(cpu=False)
    assert reads == inductor_config.realize_reads_threshold
    assert ops == (inductor_config.realize_opcount_threshold or inductor_config._realize_opcount_threshold_default)
    assert acc_reads == (inductor_config.realize_acc_reads_threshold
                         or inductor_config._realize_acc_reads_threshold_default)


_, CPU_OPS, CPU_ACC_READS = adapter.realize_thresholds(cpu=True)


def test_reuse_thresholds_are_inductors_on_the_cpu() -> None:
    """What Inductor does on this torch's CPU (checked against its lowering on torch 2.13, whose CPU
    limits are 50 ops and 12 accumulated reads): a chain of CPU_OPS - 1 negations read twice
    (CPU_OPS ops with the load) is inlined, one more is written; a sum of CPU_ACC_READS inputs read
    once is inlined, one more is written."""
    assert f"neg_{CPU_OPS - 2}" in inlined(negations(CPU_OPS - 1), X, cpu=True)
    assert f"neg_{CPU_OPS - 1}" not in inlined(negations(CPU_OPS), X, cpu=True)
    assert f"add_{CPU_ACC_READS - 2}" in inlined(summed_inputs(CPU_ACC_READS, readers=1),
                                                   *inputs(CPU_ACC_READS), cpu=True)
    assert f"add_{CPU_ACC_READS - 1}" not in inlined(summed_inputs(CPU_ACC_READS + 1, readers=1),
                                                       *inputs(CPU_ACC_READS + 1), cpu=True)


# -- The Problem with fusion ------------------------------------------------------------------


def joint(primals_1, tangents_1):
    """0 a = x + 1 (64 B; read by b and by the backward)   1 b = a * 2   2 c = sum(b) (4 B, output)
    3 g = t * a (64 B, the gradient)."""
    a = aten.add(primals_1, 1)
    b = aten.mul(a, 2)
    c = aten.sum(b)
    g = aten.mul(tangents_1, a)
    return [c, g]


@pytest.fixture(scope="module")
def fused_pair():
    gm, info = traced_joint(joint, X, torch.randn(()), num_fwd_outputs=1)
    costs = analytic_costs(gm.graph)
    return build_problem(gm.graph, info, costs, fusion=True), build_problem(gm.graph, info, costs, fusion=False)


def test_fusion_fields(fused_pair) -> None:
    """a is a candidate inlined into b in the forward and into g when recomputed: it holds memory
    only when kept, and none when recomputed. b is inlined into the sum and holds nothing."""
    fused, unfused = (p.by_name() for p in fused_pair)
    a, b = fused["add"], fused["mul"]
    assert (a.bytes, a.fused_in_forward, a.recompute_bytes, a.need_start) == (64, True, 0, 3)
    assert (b.bytes, b.fused_in_forward, b.need_start) == (0, False, None)
    assert (fused["sum_1"].bytes, fused["mul_1"].bytes) == (4, 64)
    a, b = unfused["add"], unfused["mul"]
    assert (a.bytes, a.fused_in_forward, a.recompute_bytes, b.bytes) == (64, False, None, 64)


def test_fusion_costs(fused_pair) -> None:
    """Analytic seconds of a on the CPU: 128 bytes moved at 2e10 B/s. Fused, recomputing it costs
    a tenth of that; keeping it costs a write and a read of its 64 bytes."""
    fused, unfused = (p.by_name()["add"] for p in fused_pair)
    assert fused.seconds == unfused.seconds == pytest.approx(128 / 2e10)
    assert fused.recompute_seconds == pytest.approx(128 / 2e10 * P.FUSED_RECOMPUTE_FRACTION)
    assert fused.save_seconds == pytest.approx(2 * 64 / 2e10)
    assert (unfused.recompute_seconds, unfused.save_seconds) == (pytest.approx(128 / 2e10), 0.0)


def test_fusion_timelines(fused_pair) -> None:
    """By hand (x 64 B throughout; the tangent, 4 B, and g, 64 B, at step 3; c, 4 B, from 2).
    Fused: kept, a is written (64 B from step 0 to 3) and b never is; recomputed, a is inlined
    into g and holds nothing. Unfused: b lives 1-2; a lives 0-3 kept, or 0-1 and again at 3
    recomputed."""
    fused, unfused = fused_pair
    assert solvers.evaluate(fused, {"add"}).timeline == (128, 128, 132, 200)
    assert solvers.evaluate(fused, set()).timeline == (64, 64, 68, 136)
    assert solvers.evaluate(unfused, {"add"}).timeline == (128, 192, 196, 200)
    assert solvers.evaluate(unfused, set()).timeline == (128, 192, 132, 200)


def softmax_joint(primals_1, primals_2, tangents_1):
    """An explicit softmax into a matmul, and its backward as Inductor decomposes it. Steps:

    0 e = exp(x)   1 s = sum(e)   2 p = e / s   3 o = p @ w (output)
    4 wt = w.t()   5 gp = t @ wt   6 m = gp * p   7 ss = sum(m)   8 q = p * ss   9 gx = m - q
    """
    e = aten.exp(primals_1)
    s = aten.sum(e, [-1], True)
    p = aten.div(e, s)
    o = aten.mm(p, primals_2)
    gp = aten.mm(tangents_1, aten.t(primals_2))
    m = aten.mul(gp, p)
    ss = aten.sum(m, [-1], True)
    gx = aten.sub(m, aten.mul(p, ss))
    return [o, gx]


@pytest.fixture(scope="module")
def softmax_graph():
    gm, info = traced_joint(softmax_joint, torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8), num_fwd_outputs=1)
    return gm, info, analytic_costs(gm.graph)


def test_a_value_inlined_into_two_kernels_keeps_what_it_reads_until_the_last(softmax_graph) -> None:
    """m = gp * p is inlined into the sum (step 7) and into gx (step 9): both kernels compute it
    from gp and p, so gp is read at 9, not only at 6."""
    gm, info, costs = softmax_graph
    values = build_problem(gm.graph, info, costs, fusion=True).by_name()
    assert [values[n].bytes for n in ("mul", "mul_1")] == [0, 0]  # m and q: inlined
    assert values["mm_1"].last_use == 9


def test_a_pointwise_output_takes_the_buffer_of_an_input_read_at_its_own_index(softmax_graph) -> None:
    """gx is written into the saved softmax output p (Inductor's ``decide_inplace_update``: the
    same size, read at gx's own index, no later reader), so p is the backward's until step 8
    and gx allocates nothing new beside it. gp is read at the same index too, but p comes first
    in gx's kernel and one buffer is taken once."""
    gm, info, costs = softmax_graph
    order = P.fixed_order(gm.graph, info)
    problem = build_problem(gm.graph, info, costs, fusion=True)
    values = problem.by_name()
    inlined, _ = fusion.fusion_sets(order, costs, output_nodes(gm.graph), True)
    fields = {n: {"kind": values[n.name].kind, "bytes": values[n.name].bytes, "produced": values[n.name].produced,
                  "last_use": values[n.name].last_use, "need_start": None, "need_end": None}
              for n in order.steps if n.name in values}
    fields[next(n for n in order.steps if n.name == "div")].update(need_start=5, need_end=9)
    taken = fusion.reused_in_place(order, fields, costs, inlined)
    # and in the forward p is written into e, whose last reader it is
    assert {n.name: read.name for n, read in taken.items()} == {"sub": "div", "div": "exp"}
    assert values["div"].need_end == 8
    # were o = p @ w recomputed for a reader after step 9, it would run after gx: p is not free,
    # and gx takes gp's buffer instead
    fields[next(n for n in order.steps if n.name == "mm")].update(need_start=5, need_end=9)
    taken = fusion.reused_in_place(order, fields, costs, inlined)
    assert {n.name: read.name for n, read in taken.items()} == {"div": "exp", "sub": "mm_1"}
    top = solvers.evaluate(problem, {"div"}).timeline
    assert top[9] == top[8]  # gx takes p's bytes: nothing rises where it is written


def matmul_after_a_sum(primals_1, tangents_1):
    """A pointwise value read by a reduction (step 2) and, through a view, by a matmul (step 4):
    Inductor realizes it only when the matmul lowers, so the sum computes it from its inputs."""
    a = aten.mul(tangents_1, primals_1)
    b = aten.add(a, primals_1)
    s = aten.sum(b, [0])
    v = aten.view(b, [8, 8])
    return [aten.mm(v, primals_1), s]


def test_a_reduction_lowered_before_the_extern_reader_computes_the_value_inline() -> None:
    gm = make_fx(matmul_after_a_sum, tracing_mode="fake")(torch.randn(8, 8), torch.randn(8, 8))
    steps = [n for n in gm.graph.nodes if n.op == "call_function"]
    costs = analytic_costs(gm.graph)
    outputs = output_nodes(gm.graph)
    inlined = inlined_values(steps, costs, outputs, cpu=True)
    early = fusion.inlined_early(steps, costs, outputs, inlined)
    assert {n.name: sorted(r.name for r in reads) for n, reads in early.items()} == {
        "sum_1": ["primals_1_1", "tangents_1_1"]}
