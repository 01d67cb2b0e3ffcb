"""The per-rank budget's arithmetic (passes/scope/rank_scope.py), in one process; tests/test_ranks.py
measures it on two ranks under FSDP2 and DDP."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import remat
from remat.passes.scope import rank_scope
from remat.passes.scope.rank_scope import RankScope, copies_of, fsdp2_scope
from remat.passes.torch_adapter import FsdpGroup
from remat.solvers.testing import random_problem
from tests.conftest import build


def group(module: torch.nn.Module, shard: int, unsharded: int, reshards: bool = True) -> FsdpGroup:
    return FsdpGroup((module,), shard, shard, unsharded, unsharded, reshards)


def test_copies_are_the_other_modules_built_like_the_compiled_one() -> None:
    model, _ = build("gpt", layers=3)
    assert copies_of(model.blocks[0], model) == 2
    assert copies_of(model, model) == 0  # the whole model in one graph: nothing else holds its values
    other = torch.nn.Linear(4, 4)
    assert copies_of(other, torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 8), other)) == 1


def test_fsdp2_counts_every_shard_the_root_kept_unsharded_a_prefetch_and_a_reduce_scatter() -> None:
    model, _ = build("gpt", layers=3)
    blocks = [group(b, shard=100, unsharded=200) for b in model.blocks]
    root = group(model, shard=50, unsharded=100, reshards=False)  # the root stays unsharded through the step
    scope = fsdp2_scope([root, *blocks], model.blocks[2], model, model.blocks[2], graph_params=200, inputs=30)
    assert scope.resident_bytes == 2 * (50 + 3 * 100) + 100  # parameter and gradient shards, the root's parameters
    assert scope.comm_bytes == 200 + 200  # the next block's all-gather, one reduce-scatter input
    assert (scope.copies, scope.copy_input_bytes) == (2, 60)
    assert scope.outside_bytes == scope.resident_bytes + scope.comm_bytes + 60


def test_a_graph_of_the_unresharded_root_counts_its_other_parameters_only() -> None:
    model, _ = build("gpt", layers=1)
    root = group(model, shard=50, unsharded=100, reshards=False)
    scope = fsdp2_scope([root], model, model, model, graph_params=100, inputs=0)
    assert (scope.resident_bytes, scope.comm_bytes, scope.copies) == (100, 100, 0)


def test_a_scope_puts_its_bytes_in_the_problem() -> None:
    problem = random_problem(3, 12, 12)
    scoped = RankScope("FSDP2", copies=2, resident_bytes=10, comm_bytes=5, copy_input_bytes=4).applied(problem)
    assert (scoped.outside_bytes, scoped.kept_copies) == (19, 2)
    assert scoped.values == problem.values
    named = dict(scoped.outside)
    assert sum(named.values()) == 19 and any("FSDP2's communication" in what for what in named)


def test_a_single_process_scope_names_its_parts_in_a_single_processs_words() -> None:
    """What a BudgetError lists at the peak: no shards or ranks in a process's step."""
    problem = random_problem(3, 12, 12)
    scope = RankScope("process", resident_bytes=10, eager_bytes=30, eager_after_bytes=8, eager_reserved=True)
    scoped = scope.applied(problem)
    assert dict(scoped.outside) == {"the model's state the graph does not read, and what tracing keeps for it": 10,
                                    "what the eager code after the graph keeps through the backward (a loss)": 8}
    assert scoped.handoff_bytes == 22 and "reserved until measured" in scoped.handoff[0][0]
    assert not any(word in what for what, _ in (*scoped.outside, *scoped.handoff) for word in ("shard", "rank"))


def test_without_fsdp_or_ddp_the_budget_bounds_the_process_step_unless_graph_is_asked() -> None:
    model, inputs = build("gpt", layers=1)
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    for asked in ("auto", "step", "rank"):
        scope = rank_scope.scope_of(gm, [], asked)
        assert scope is not None and scope.process and (scope.copies, scope.outside_bytes) == (0, 0)
    assert rank_scope.scope_of(gm, [], "graph") is None
    report = remat.plan(model, *inputs, compiler="eager", budget_scope="rank")
    assert report.budget_scope == "step" and report.kept_copies == 0 and report.eager_bytes == 0  # loss inside


def test_budget_scope_is_checked() -> None:
    with pytest.raises(ValueError, match="budget_scope must be one of"):
        remat.Options(budget_scope="node")


def test_unread_state_counts_each_storage_the_graph_does_not_take_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight  # tied: one storage
    model.register_buffer("unused", torch.zeros(8))
    model.register_buffer("on_meta", torch.zeros(1000, device="meta"))
    monkeypatch.setattr(rank_scope.adapter, "modules_being_called", lambda: [model])
    weight, bias = model[0].weight, model[0].bias
    assert rank_scope.unread_state_bytes([weight, bias]) == 8 * 4  # the unused buffer; meta holds nothing
    assert rank_scope.unread_state_bytes([bias]) == 16 * 4 + 8 * 4  # the tied weight counted once
    assert rank_scope.unread_state_bytes([weight.detach(), bias, model.unused]) == 0  # a view reads its storage
    monkeypatch.setattr(rank_scope.adapter, "modules_being_called", lambda: [])
    assert rank_scope.unread_state_bytes([]) == 0  # a function, not a module


def test_the_eager_code_after_a_graph_is_reserved_as_three_times_its_outputs_that_need_a_gradient() -> None:
    def graph_with_outputs(*values: torch.Tensor) -> torch.fx.GraphModule:
        graph = torch.fx.Graph()
        nodes = []
        for i, value in enumerate(values):
            node = graph.placeholder(f"x{i}")
            node.meta["example_value"] = value
            nodes.append(node)
        graph.output(tuple(nodes))
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    logits = torch.empty(4, 8, requires_grad=True)  # 128 bytes
    assert rank_scope.reserved_eager_bytes(graph_with_outputs(logits, torch.empty(100))) == 3 * 128
    assert rank_scope.reserved_eager_bytes(graph_with_outputs(torch.empty((), requires_grad=True))) == 0  # a loss


def test_what_torchs_tracing_keeps_alive_for_a_graph_is_counted_as_its_state() -> None:
    """Dynamo's fake example values carry autograd nodes, which save a Python number an op multiplied or
    divided by as a real 8-byte tensor: held as long as the graph, on the device of that number (the CPU)."""
    seen = {}

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        seen["traced"] = rank_scope.traced_storages(gm, example_inputs)
        seen["state"] = rank_scope.state_storages(gm, example_inputs)
        return gm.forward

    weight = torch.nn.Parameter(torch.randn(4, 4))
    torch.compile(lambda x: (x @ weight * 0.5 / 3.0).relu(), backend=capture)(torch.randn(2, 4))
    assert sorted(seen["traced"].values()) == [8, 8]  # float64 scalars, one per op
    assert seen["traced"].items() <= seen["state"].items()
    torch._dynamo.reset()
    torch.compile(lambda x: (x @ weight).relu(), backend=capture)(torch.randn(2, 4))
    assert seen["traced"] == {}


def test_a_ranks_scope_counts_what_torchs_tracing_keeps_as_a_process_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DDP (or FSDP2) the graph's traced scalars are resident on the rank too."""
    inner = torch.nn.Linear(4, 4)
    wrapper = torch.nn.Module()
    wrapper.module = inner  # what DDP wraps
    monkeypatch.setattr(rank_scope.adapter, "modules_being_called", lambda: [inner, wrapper])
    monkeypatch.setattr(rank_scope.adapter, "is_ddp_module", lambda m: m is wrapper)
    scopes = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        scopes.append(rank_scope.scope_of(gm, example_inputs, "auto"))
        return gm.forward

    torch.compile(lambda x: (inner(x) * 0.5).relu(), backend=capture)(torch.randn(2, 4))
    (scope,) = scopes
    buckets = sum(p.numel() * p.element_size() for p in inner.parameters())
    assert (scope.wrapper, scope.traced_bytes) == ("DDP", 8)
    assert scope.resident_bytes == buckets + 8


def test_the_reservation_after_a_block_is_as_wide_as_the_head_outside_it() -> None:
    """Blocks compiled one by one hand a language model's head their outputs: the eager code after the
    last block (head and loss) is as wide as the head's vocabulary over its width."""
    model, _ = build("gpt", layers=3, d_model=32, vocab=96)
    assert rank_scope.head_widening(model.blocks[0], model) == 96 / 32
    assert rank_scope.head_widening(model, model) == 1.0  # the whole model in one graph: its outputs are the logits
    wide_inside = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Linear(64, 4)),
                                      torch.nn.Linear(4, 2))
    assert rank_scope.head_widening(wide_inside[0], wide_inside) == 1.0  # a layer inside the block, a narrow head
