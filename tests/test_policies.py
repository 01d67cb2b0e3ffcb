"""Decisions as policies: pinned decisions hold in the plan, SAFETY always wins, the ILP decides the rest."""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.policies import Pin, Policy, Verdict, recompute_ops, save_matmuls, save_ops
from tests.conftest import build

MATMUL_CLASS = {"matmul", "attention", "convolution"}


def plan(name: str, **options: object) -> remat.Report:
    model, inputs = build(name, layers=1)
    return remat.plan(model, *inputs, compiler="eager", **options)


def test_save_matmuls_keeps_matmul_class_outputs_and_recomputes_the_rest() -> None:
    report = plan("gpt", policy=save_matmuls)
    kept = {n.category for n in report.nodes if n.decision == "kept"}
    recomputed = {n.category for n in report.nodes if n.decision == "recomputed"}
    assert "matmul" in kept and not recomputed & MATMUL_CLASS
    # everything kept that is not matmul-class cannot be recomputed (a random op, say) or is a view's base
    others = [n for n in report.nodes if n.decision == "kept" and n.category not in MATMUL_CLASS]
    assert all(n.reason.startswith("kept: policy save-matmuls") is False for n in others)
    assert any(n.reason == "kept: policy save-matmuls: a matmul-class output" for n in report.nodes)


def test_the_policy_by_name_is_the_same_plan_as_the_policy_itself() -> None:
    by_value, by_name = plan("gpt", policy=save_matmuls), plan("gpt", policy="save-matmuls")
    assert (by_value.saved, by_value.recomputed) == (by_name.saved, by_name.recomputed)


def test_a_pinned_op_is_recomputed_and_the_ilp_decides_the_rest() -> None:
    """With no budget the ILP keeps layer norm's statistics (rsqrt); pinned, they are recomputed,
    the rest is still the ILP's (kept), and the plan is no faster than the free one."""
    free = plan("gpt")
    pinned = plan("gpt", policy=recompute_ops("rsqrt"))
    rsqrt = [n.name for n in free.nodes if n.op == "aten.rsqrt.default" and n.decision in ("kept", "recomputed")]
    assert rsqrt and set(rsqrt) <= set(free.saved)
    assert set(rsqrt) <= set(pinned.recomputed)
    assert set(pinned.recomputed) - set(rsqrt) <= set(free.recomputed) | {
        n.name for n in pinned.nodes if n.bytes == 0}  # nothing else recomputed but free views
    assert pinned.predicted_overhead_seconds >= free.predicted_overhead_seconds


def test_safety_wins_over_a_policy_that_recomputes_everything() -> None:
    everything = Policy("recompute-everything", lambda node: Verdict(Pin.MUST_RECOMPUTE, "asked"))
    report = plan("mlp-dropout", policy=everything)
    random = [n for n in report.nodes if n.category == "random" and n.decision in ("kept", "recomputed")]
    assert random and all(n.decision == "kept" for n in random)
    assert all(n.reason.startswith("kept: random op") for n in random)


def test_policies_compose_first_opinion_wins() -> None:
    both = save_ops("addmm") | recompute_ops("addmm", "gelu")
    assert both.name == "save-ops(addmm) | recompute-ops(addmm,gelu)"
    gm = torch.fx.symbolic_trace(lambda x, w, b: torch.ops.aten.gelu(torch.ops.aten.addmm(b, x, w)))
    verdicts = {n.name: both(n) for n in gm.graph.nodes if n.op == "call_function"}
    pins = {name: v.pin for name, v in verdicts.items() if v is not None}
    assert set(pins.values()) == {Pin.MUST_SAVE, Pin.MUST_RECOMPUTE} and len(pins) == 2


def test_a_policy_keeps_gradients_exact() -> None:
    model, inputs = build("gpt", layers=1)
    reference = copy.deepcopy(model)
    reference(*inputs).backward()
    compiled = remat.compile(model, compiler="eager", policy="save-matmuls")
    compiled(*inputs).backward()
    for p, p_ref in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad)


@pytest.mark.parametrize("bad", ["save-everything", 3, save_matmuls.rule])
def test_an_unknown_policy_is_refused_with_the_names_it_takes(bad: object) -> None:
    with pytest.raises(ValueError, match="policy must be a remat.policies.Policy or one of"):
        remat.Options(policy=bad)  # type: ignore[arg-type]
