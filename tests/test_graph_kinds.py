"""Graphs people actually give remat: graph breaks, dynamic sizes, inference,
outputs without gradients, non-tensor outputs, custom ops with and without a
fake kernel. Each either works, equal to eager, or fails with a remat error
that says what to do."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import remat
from remat.errors import GIB
from tests.conftest import build


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(model: nn.Module, reference: nn.Module) -> None:
    expected, actual = grads(reference), grads(model)
    assert expected.keys() == actual.keys() and expected
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=1e-5, rtol=1e-4, msg=key)


def mlp(width: int = 32) -> nn.Module:
    return nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))


# -- Graph breaks --------------------------------------------------------------------


class ThreeGraphs(nn.Module):
    """Two graph breaks: dynamo makes three graphs; the middle one is the largest."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), mlp(256), nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        torch._dynamo.graph_break()
        h = self.b(h[:, :16])
        torch._dynamo.graph_break()
        return self.c(h).square().mean()


def test_each_graph_of_a_broken_model_is_planned_within_the_budget() -> None:
    model, x = ThreeGraphs(), torch.randn(64, 32)
    reference = copy.deepcopy(model)
    reference(x).backward()
    free = remat.compile(copy.deepcopy(model), compiler="eager")
    free(x).backward()
    lows = [r.min_feasible_bytes for r in remat.reports(free)]
    assert len(lows) == 3
    torch._dynamo.reset()
    budget = max(lows) / GIB  # the largest graph's smallest budget binds it; the others fit easily
    compiled = remat.compile(model, budget_gb=budget, compiler="eager")
    compiled(x).backward()
    reports = remat.reports(compiled)
    assert len(reports) == 3 and all(r.budget_bytes == int(budget * GIB) for r in reports)
    assert all(r.realized_peak_bytes <= r.predicted_peak_bytes <= r.planned_budget_bytes for r in reports)
    assert_same_grads(model, reference)


def test_a_budget_one_graph_of_several_cannot_fit_raises() -> None:
    model, x = ThreeGraphs(), torch.randn(64, 32)
    free = remat.compile(copy.deepcopy(model), compiler="eager")
    free(x).backward()
    lows = sorted(r.min_feasible_bytes for r in remat.reports(free))
    torch._dynamo.reset()
    budget = (lows[0] + lows[-1]) / 2 / GIB  # enough for the smallest graph, not for the largest
    compiled = remat.compile(model, budget_gb=budget, compiler="eager")
    with pytest.raises(remat.BudgetError) as caught:
        compiled(x).backward()
    assert caught.value.min_feasible_bytes == lows[-1]


# -- Dynamic sizes --------------------------------------------------------------------


def test_dynamic_true_under_a_budget_is_planned_per_size_and_matches_eager() -> None:
    model = mlp()
    reference = copy.deepcopy(model)
    compiled = remat.compile(model, budget_gb=0.01, compiler="eager", dynamic=True)
    for rows in (8, 24):
        x = torch.randn(rows, 16)
        reference(x).sum().backward()
        compiled(x).sum().backward()
    assert_same_grads(model, reference)
    reports = remat.reports(compiled)
    assert len(reports) == 2 and all("dynamic sizes pinned" in " ".join(r.notes) for r in reports)


def test_maybe_mark_dynamic_under_a_budget_is_planned_per_size() -> None:
    model = mlp()
    compiled = remat.compile(model, budget_gb=0.01, compiler="eager")
    for rows in (8, 16, 24):
        x = torch.randn(rows, 16)
        torch._dynamo.maybe_mark_dynamic(x, 0)
        compiled(x).sum().backward()
    assert len(remat.reports(compiled)) == 3


def test_mark_dynamic_under_a_budget_is_a_clear_error() -> None:
    compiled = remat.compile(mlp(), budget_gb=0.01, compiler="eager")
    x = torch.randn(8, 16)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(remat.GraphError, match="mark_dynamic.*maybe_mark_dynamic.*budget_gb=None"):
        compiled(x)


def test_mark_dynamic_without_a_budget_keeps_one_symbolic_plan() -> None:
    model = mlp()
    reference = copy.deepcopy(model)
    compiled = remat.compile(model, compiler="eager")
    for rows in (8, 16, 24):
        x = torch.randn(rows, 16)
        torch._dynamo.mark_dynamic(x, 0)
        compiled(x).sum().backward()
        reference(x).sum().backward()
    assert len(remat.reports(compiled)) == 1
    assert_same_grads(model, reference)


def test_a_second_size_of_a_transformer_without_a_budget_plans_its_symbolic_graph() -> None:
    """dynamo compiles a second size of the same code with symbolic sizes: reshapes then read
    sizes computed in the graph (SymInt nodes), which the backward gets for free."""
    first, first_inputs = build("gpt", layers=1, seq=32)
    remat.plan(first, *first_inputs, compiler="eager")
    model, inputs = build("gpt", layers=1, seq=48)
    reference = copy.deepcopy(model)
    report = remat.plan(model, *inputs, compiler="eager")
    assert report.saved and report.predicted_peak_bytes <= report.store_all_peak_bytes
    compiled = remat.compile(model, compiler="eager")
    compiled(*inputs).backward()
    reference(*inputs).backward()
    assert_same_grads(model, reference)


# -- Inference: nothing to plan ---------------------------------------------------------


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "frozen"])
def test_inference_graphs_pass_through(mode: str, compiler: str) -> None:
    model, x = mlp().eval(), torch.randn(8, 16)
    if mode == "frozen":
        model.requires_grad_(False)
    expected = model(x)
    compiled = remat.compile(model, budget_gb=0.01, compiler=compiler)
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
    with context():
        torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-5)
    assert remat.reports(compiled) == []


def test_plan_of_an_inference_graph_says_there_is_nothing_to_plan() -> None:
    model = mlp().requires_grad_(False)
    with pytest.raises(ValueError, match="nothing to plan"):
        remat.plan(model, torch.randn(8, 16), compiler="eager")


# -- Outputs --------------------------------------------------------------------------------


class ManyOutputs(nn.Module):
    """Returns the loss with an integer tensor (no grad), a python int, a string and None."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> tuple:
        logits = self.net(x)
        return logits.logsumexp(-1).mean(), logits.argmax(-1), x.shape[0], "logits", None


def test_outputs_that_need_no_grad_and_non_tensor_outputs() -> None:
    model, x = ManyOutputs(), torch.randn(32, 16)
    reference = copy.deepcopy(model)
    expected = reference(x)
    expected[0].backward()
    low = remat.plan(model, x, compiler="eager").min_feasible_bytes
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=low / GIB, compiler="eager")
    actual = compiled(x)
    actual[0].backward()
    torch.testing.assert_close(actual[0], expected[0])
    assert torch.equal(actual[1], expected[1]) and actual[1].dtype == torch.long and not actual[1].requires_grad
    assert actual[2:] == (32, "logits", None)
    assert_same_grads(model, reference)
    assert len(remat.reports(compiled)) == 1


# -- Custom ops -----------------------------------------------------------------------------


@torch.library.custom_op("remat_tests::wave", mutates_args=())
def wave(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x * sin(w): torch's FLOP counter has no formula for it."""
    return x * w.sin()


@wave.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _wave_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _wave_backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = ctx.saved_tensors
    return grad * w.sin(), (grad * x * w.cos()).sum(0)


wave.register_autograd(_wave_backward, setup_context=_wave_setup)


@torch.library.custom_op("remat_tests::unfaked", mutates_args=())
def unfaked(x: torch.Tensor) -> torch.Tensor:
    """An op with no fake kernel: its output shapes cannot be traced."""
    return x * 2


unfaked.register_autograd(lambda ctx, grad: grad * 2, setup_context=lambda ctx, inputs, output: None)


class WithOp(nn.Module):
    def __init__(self, op) -> None:
        super().__init__()
        self.fc, self.w, self.op = nn.Linear(16, 64), nn.Parameter(torch.randn(64)), op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = wave(h, self.w) if self.op == "wave" else unfaked(h)
        return torch.tanh(h).square().mean()


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_custom_op_without_a_flop_formula_is_costed_by_measurement(compiler: str) -> None:
    model, x = WithOp("wave"), torch.randn(32, 16)
    reference = copy.deepcopy(model)
    reference(x).backward()
    top = remat.plan(model, x, compiler=compiler)
    row = next(n for n in top.nodes if n.op == "remat_tests.wave.default")
    assert row.flops == 0 and row.seconds > 0
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=top.min_feasible_bytes / GIB, compiler=compiler)
    compiled(x).backward()
    assert_same_grads(model, reference)


@pytest.mark.parametrize("call", ["compile", "plan"])
def test_op_without_a_fake_kernel_is_a_clear_error(call: str) -> None:
    model, x = WithOp("unfaked"), torch.randn(32, 16)
    with pytest.raises(remat.GraphError, match="remat_tests.unfaked.*no fake .*register_fake") as caught:
        if call == "compile":
            remat.compile(model, budget_gb=1, compiler="eager")(x)
        else:
            remat.plan(model, x, compiler="eager")
    assert caught.value.__cause__ is None and "Traceback" not in str(caught.value)
