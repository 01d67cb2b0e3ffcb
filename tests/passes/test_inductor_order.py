"""The scheduler pass that runs each fused kernel where its last part was (``inductor_order``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from remat.passes import torch_adapter as adapter
from remat.passes.torch_adapter.inductor_order import FusedAtLastPart, order_settings


@dataclass(frozen=True)
class Dep:
    name: str


@dataclass(eq=False)
class Node:
    """What the pass reads of an Inductor scheduler node."""

    name: str
    max_order: int
    reads: tuple[str, ...] = ()
    buffers: tuple[str, ...] = field(default=())

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
