"""The scheduler pass that runs each fused kernel where its last part was (``inductor_order``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from remat.passes import torch_adapter as adapter
from remat.passes.torch_adapter.inductor_order import (
    FusedAtLastPart,
    LocalFusion,
    _spans_extern_kernel,
    fusion_choices,
    has_fusion_choices,
    order_settings,
)


@dataclass(frozen=True)
class Dep:
    name: str


@dataclass(eq=False)
class Node:
    """What the pass reads of an Inductor scheduler node."""

    name: str
    max_order: int
    reads: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()

    def get_buffer_names(self) -> tuple[str, ...]:
        return self.buffers or (self.name,)

    @property
    def unmet_dependencies(self) -> set[Dep]:
        return {Dep(r) for r in self.reads}


def names(nodes: list[Node]) -> list[str]:
    return [n.name for n in nodes]


def test_a_fused_kernel_no_longer_pulls_a_recompute_above_an_independent_kernel() -> None:
    # The 4-layer GPT's case: a kernel fused from parts at 140 and 157 needs the recomputed
    # matmul (150); Inductor placed it at 140, so the matmul ran before the weight-gradient
    # matmul (144) that frees a kept activation.
    weight_grad = Node("weight_grad", 144)
    recompute = Node("recompute", 150)
    fused = Node("fused", 157, reads=("recompute",))
    inductor_order = [fused, weight_grad, recompute]  # by first part; the sort puts recompute first
    assert names(FusedAtLastPart()(inductor_order)) == ["weight_grad", "recompute", "fused"]


def test_every_kernel_still_runs_after_its_producers() -> None:
    # A producer whose last part is later than its consumer's is moved up to just before it.
    early_use = Node("early_use", 10, reads=("late_producer",))
    late_producer = Node("late_producer", 30, buffers=("late_producer", "other_output"))
    middle = Node("middle", 20)
    last = Node("last", 40, reads=("other_output", "middle"))
    order = FusedAtLastPart()([late_producer, early_use, middle, last])
    position = {n.name: i for i, n in enumerate(order)}
    assert sorted(position) == ["early_use", "last", "late_producer", "middle"]
    for node in order:
        for dep in node.unmet_dependencies:
            assert position[dep.name.replace("other_output", "late_producer")] < position[node.name]
    assert names(order) == ["late_producer", "early_use", "middle", "last"]


def test_a_long_chain_does_not_hit_the_recursion_limit() -> None:
    chain = [Node("n0", 0)] + [Node(f"n{i}", 5000 - i, reads=(f"n{i - 1}",)) for i in range(1, 3000)]
    assert names(FusedAtLastPart()(chain[::-1])) == [f"n{i}" for i in range(3000)]


def test_the_pass_has_a_cache_key_and_is_installed_for_remats_compiles() -> None:
    settings = order_settings()
    if not settings:
        pytest.skip("this torch has no post-fusion scheduler hook")
    (setting, scheduler_pass), = settings.items()
    assert isinstance(scheduler_pass, FusedAtLastPart) and scheduler_pass.uuid()
    assert isinstance(adapter.INDUCTOR_SETTINGS[setting], FusedAtLastPart)


def test_remat_compiles_through_the_pass_and_gradients_match_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    import remat
    from remat.zoo import build

    if not order_settings():
        pytest.skip("this torch has no post-fusion scheduler hook")
    calls = []
    original = FusedAtLastPart.__call__

    def counted(self: FusedAtLastPart, nodes: list) -> list:  # type: ignore[type-arg]
        calls.append(len(nodes))
        return original(self, nodes)

    monkeypatch.setattr(FusedAtLastPart, "__call__", counted)
    torch.manual_seed(0)
    model, inputs = build("gpt", layers=2, d_model=32, heads=2, seq=16, vocab=64, batch=2)
    model(*inputs).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    remat.compile(model, budget_gb=None, plan_cache=False)(*inputs).backward()
    assert len(calls) >= 2  # the forward and the backward program
    for p, g in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)


@dataclass(eq=False)
class Kernel:
    """What the fusion rule reads of a scheduler node: its span in the FX order."""

    min_order: int
    max_order: int
    extern: bool = False

    def is_extern(self) -> bool:
        return self.extern


@dataclass(eq=False)
class Scheduler:
    nodes: list[Kernel]


def test_a_horizontal_fusion_may_not_span_an_extern_kernel() -> None:
    # SwiGLU's backward: silu(gate) * up at 3, the matmul making the incoming gradient at 5,
    # the gate and up gradients at 7 and 8
    h, mm, dg, du = Kernel(3, 3), Kernel(5, 5, extern=True), Kernel(7, 7), Kernel(8, 8)
    scheduler = Scheduler([Kernel(0, 0), h, mm, dg, du])
    assert _spans_extern_kernel(scheduler, h, dg) and _spans_extern_kernel(scheduler, du, h)
    assert not _spans_extern_kernel(scheduler, dg, du)  # neighbours
    assert not _spans_extern_kernel(scheduler, Kernel(3, 6), dg)  # a group already past the matmul
    assert not _spans_extern_kernel(Scheduler([Kernel(1, 1), Kernel(4, 4)]), Kernel(1, 1), Kernel(4, 4))


def test_neither_kind_of_fusion_may_span_an_extern_kernel() -> None:
    if not has_fusion_choices():
        pytest.skip("this torch has no out-of-tree fusion choices")
    h, mm, dg = Kernel(3, 3), Kernel(5, 5, extern=True), Kernel(7, 7)
    scheduler = Scheduler([Kernel(0, 0), h, mm, dg])
    assert not LocalFusion.can_fuse_vertical(scheduler, h, dg, 0)  # dg reads h: h would run after mm
    assert not LocalFusion.can_fuse_horizontal(scheduler, h, dg, 0)


def test_the_rule_is_installed_only_inside_the_block() -> None:
    from torch._inductor.virtualized import V

    if not has_fusion_choices():
        pytest.skip("this torch has no out-of-tree fusion choices")
    before = type(V.choices)
    with fusion_choices(LocalFusion):
        assert isinstance(V.choices, LocalFusion)
    assert type(V.choices) is before
    with fusion_choices(None):
        assert type(V.choices) is before


def test_remat_decides_fusions_with_the_rule_and_torch_alone_without(monkeypatch: pytest.MonkeyPatch) -> None:
    import remat
    from remat.zoo import build

    if not has_fusion_choices():
        pytest.skip("this torch has no out-of-tree fusion choices")
    asked = []
    original = LocalFusion.can_fuse_horizontal

    def counted(scheduler: object, node1: object, node2: object, score: int) -> bool:
        asked.append(1)
        return original(scheduler, node1, node2, score)

    monkeypatch.setattr(LocalFusion, "can_fuse_horizontal", staticmethod(counted))
    model, inputs = build("llama", layers=1, d_model=32, heads=2, seq=16, vocab=64, batch=2)
    torch._dynamo.reset()
    # caches off: a hit would decide no fusions at all
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        torch.compile(model)(*inputs).backward()
    assert not asked, "torch.compile's own graphs keep Inductor's choices"
    torch._dynamo.reset()
    remat.compile(model, plan_cache=False)(*inputs).backward()
    assert asked


def test_the_swiglu_backward_peaks_where_the_plan_says() -> None:
    """Llama-style at the contract's size: the smallest-peak plan's program peaked 33 % above
    the plan when Inductor fused the recomputed ``silu(gate) * up`` with the gate and up
    gradients, across the matmul that makes the incoming gradient."""
    import remat
    from remat.zoo import build

    if not has_fusion_choices():
        pytest.skip("this torch has no out-of-tree fusion choices")
    model, inputs = build("llama", batch=8, seq=64)
    torch._dynamo.reset()
    report = remat.plan(model, *inputs, plan_cache=False)
    smallest = remat.plan(model, *inputs, budget_gb=report.min_feasible_bytes / 2**30, plan_cache=False)
    assert smallest.compiled_peak_bytes <= 1.02 * smallest.predicted_peak_bytes
