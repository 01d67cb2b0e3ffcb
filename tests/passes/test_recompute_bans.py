"""Recompute bans (``recompute_ban``/``ban_reading_written_inputs`` in passes/modeling/problem.py,
``is_random`` in passes/capture/taxonomy.py): what may never be recomputed, and what stays free.

Random ops: recomputing one draws new numbers, so dropout with p > 0 is kept; with p = 0 it
draws nothing and is an ordinary op. A buffer the forward writes in place (BatchNorm's running
statistics) holds its new value by the backward, so a value computed from it cannot be
recomputed there.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from remat import solvers
from remat.passes import torch_adapter as adapter
from remat.passes.modeling.problem import build_problem
from remat.passes.capture.taxonomy import is_random, node_kind
from remat.solvers.model import recomputable

from .helpers import aten, analytic_costs, capture

RANDOM = "random op: recomputing it would draw new random numbers"
WRITTEN = "reads a buffer the forward updates in place"


def forward_bans(got) -> dict[str, str | None]:
    problem = build_problem(got.joint, got.info, analytic_costs(got.joint))
    return {v.name: v.recompute_ban for v in problem.values if v.kind.value == "forward"}


class Dropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.fc, self.p = nn.Linear(4, 4), p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.fc(x), self.p, training=True).tanh()


@pytest.mark.parametrize("aten_random", [False, True], ids=["inductor-random", "aten-random"])
def test_dropout_with_p_zero_is_not_random(aten_random: bool) -> None:
    """p = 0 traces to a clone, with Inductor's decompositions or aten's: nothing is banned."""
    with adapter.inductor_settings(fallback_random=True) if aten_random else contextlib.nullcontext():
        got = capture(Dropout(0.0), torch.randn(3, 4), run_backward=False)
    bans = forward_bans(got)
    assert bans == {"permute": None, "addmm": None, "clone": None, "tanh": None}


def test_dropout_with_p_positive_is_banned_inductor_random() -> None:
    """Under Inductor's decompositions dropout is rand > p: rand is banned; the mask and the
    scaled output are pointwise ops on it, recomputable only from a kept rand."""
    got = capture(Dropout(0.5), torch.randn(3, 4), run_backward=False)
    bans = forward_bans(got)
    assert bans == {"permute": None, "addmm": None, "rand": RANDOM, "gt": None, "mul": None, "mul_1": None,
                    "tanh": None}
    problem = build_problem(got.joint, got.info, analytic_costs(got.joint))
    assert "rand" not in recomputable(problem)
    assert "rand" in solvers.recompute_all(problem).saved


def test_dropout_with_p_positive_is_banned_aten_random() -> None:
    """With aten's randomness (``fallback_random``) dropout stays native_dropout: it and both
    of its outputs (the value and the mask) are banned."""
    with adapter.inductor_settings(fallback_random=True):
        got = capture(Dropout(0.5), torch.randn(3, 4), run_backward=False)
    bans = forward_bans(got)
    assert {n: b for n, b in bans.items() if b} == {"native_dropout": RANDOM, "getitem": RANDOM,
                                                   "getitem_1": RANDOM}


def make_forward(fn, *example):
    return make_fx(fn, tracing_mode="fake")(*example)


def sdpa_graph(*args, **kwargs):
    q = torch.randn(1, 2, 4, 8)
    return make_forward(lambda q: aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, *args, **kwargs), q)


@pytest.mark.parametrize(("args", "kwargs", "random"), [
    ((), {}, False),                       # dropout_p defaults to 0
    ((0.0,), {}, False),
    ((0.5,), {}, True),
    ((), {"dropout_p": 0.5}, True),
], ids=["default", "p0", "p0.5", "p0.5-kwarg"])
def test_attention_is_random_only_with_dropout(args, kwargs, random: bool) -> None:
    """SDPA carries the nondeterministic tag whatever its dropout_p: it is random only when
    dropout_p is nonzero (positional or keyword)."""
    gm = sdpa_graph(*args, **kwargs)
    sdpa = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert torch.Tag.nondeterministic_seeded in sdpa.target.tags
    assert is_random(sdpa) is random
    assert node_kind(sdpa) == ("random" if random else "tuple")


def test_native_dropout_with_p_positive_is_random() -> None:
    gm = make_forward(lambda x: aten.native_dropout(x, 0.5, True)[0], torch.randn(4))
    dropout = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert is_random(dropout)


def test_native_dropout_with_p_zero_is_not_random() -> None:
    gm = make_forward(lambda x: aten.native_dropout(x, 0.0, True)[0], torch.randn(4))
    dropout = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert not is_random(dropout)


# -- Buffers the forward writes -------------------------------------------------------------


class Scaled(nn.Module):
    """y = cos((x * w) * sin(buf)); the forward then adds 1 to buf in place (unless frozen).
    The backward reads sin(buf): recomputed there, it would read the new buf."""

    def __init__(self, update: bool) -> None:
        super().__init__()
        self.w, self.update = nn.Parameter(torch.randn(4)), update
        self.register_buffer("buf", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.buf.view(2, 2).sin().view(4)  # read through a view of the buffer
        y = (x * self.w * scale).cos()
        if self.update:
            self.buf.add_(1)
        return y


def test_a_value_read_from_a_buffer_the_forward_writes_is_banned() -> None:
    """The joint graph reads buf (primals_1) through view -> sin -> view_1; the backward reads
    view_1. Everything computed from buf is banned: view, sin and the update buf + 1 (add)."""
    got = capture(Scaled(update=True), torch.randn(3, 4), run_backward=False)
    bans = forward_bans(got)
    assert adapter.mutated_inputs(got.joint) == {"primals_1"}
    assert {n: b for n, b in bans.items() if b} == {"view": WRITTEN, "sin": WRITTEN, "add": WRITTEN}
    problem = build_problem(got.joint, got.info, analytic_costs(got.joint))
    values = problem.by_name()
    assert values["sin"].is_candidate and values["view_1"].direct_need
    assert recomputable(problem) == {"view_1", "mul", "mul_1"}
    assert solvers.recompute_all(problem).saved == {"sin"}


def test_without_the_write_the_same_value_is_recomputable() -> None:
    got = capture(Scaled(update=False), torch.randn(3, 4), run_backward=False)
    assert adapter.mutated_inputs(got.joint) == set()
    assert not any(forward_bans(got).values())
    problem = build_problem(got.joint, got.info, analytic_costs(got.joint))
    assert "sin" in recomputable(problem)


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.bn = nn.Linear(4, 4), nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x)).relu()


def test_batchnorm_running_stats_ban_what_reads_them() -> None:
    """In training BatchNorm writes num_batches_tracked (+1) and the running mean and variance
    (0.9 old + 0.1 new): the three values read from the old buffers are banned; the batch
    statistics the backward needs are not."""
    got = capture(Norm().train(), torch.randn(3, 4), run_backward=False)
    bans = forward_bans(got)
    assert adapter.mutated_inputs(got.joint) == {"primals_4", "primals_5", "primals_6"}
    banned = {n for n, b in bans.items() if b}
    assert banned == {"add", "mul_2", "mul_5"} and {bans[n] for n in banned} == {WRITTEN}
    readers = {u.name for n in got.joint.nodes if n.name in ("primals_4", "primals_5", "primals_6")
               for u in n.users}
    assert readers == banned
    assert bans["var_mean"] is None and bans["rsqrt"] is None


def test_batchnorm_in_eval_reads_running_stats_it_does_not_write() -> None:
    got = capture(Norm().eval(), torch.randn(3, 4), run_backward=False)
    assert adapter.mutated_inputs(got.joint) == set()
    assert not any(forward_bans(got).values())


def test_inductors_random_prims_hold_no_scratch_under_inductor() -> None:
    """Inductor generates its random prims inside kernels: under its fusion they hold no scratch,
    whatever their eager kernel allocates (the graph's targets are overloads of the prims, which
    the rule once looked up as packets, and missed)."""
    from remat.passes.modeling.problem import step_workspace
    from remat.passes.costs.profile import NodeCost

    def f(x: torch.Tensor) -> torch.Tensor:
        seeds = torch.ops.prims.inductor_seeds.default(1, torch.device("cpu"))
        seed = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
        return torch.ops.prims.inductor_random.default([3, 4], seed, "rand") + x

    graph = make_fx(f)(torch.randn(3, 4)).graph
    prims = [n for n in graph.nodes if n.op == "call_function" and "inductor_" in str(n.target)]
    assert len(prims) == 3
    for node in prims:
        cost = NodeCost(bytes=48, flops=0.0, seconds=0.0, workspace=48, kind="random")
        assert step_workspace(node, cost, fusion=True) == 0 and step_workspace(node, cost, fusion=False) == 48
