"""End to end on real models: gradients, buffers and outputs equal to eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._inductor.config as inductor_config

import remat
from bench import hf_models
from tests.conftest import INDUCTOR_SIZE, budget_between, build, planned


def eager_step(model: torch.nn.Module, inputs: tuple, seed: int = 0, run=None) -> tuple[torch.Tensor, dict, dict]:
    """One step of ``run`` (default: ``model``); grads and buffers read from ``model``."""
    torch.manual_seed(seed)
    loss = (run if run is not None else model)(*inputs)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    return loss.detach(), grads, buffers


def compiled_step(model: torch.nn.Module, inputs: tuple, budget_gb: float | None, compiler: str,
                  seed: int = 0) -> tuple[torch.Tensor, dict, dict, remat.Report]:
    compiled = remat.compile(model, budget_gb=budget_gb, compiler=compiler)
    loss, grads, buffers = eager_step(model, inputs, seed, run=compiled)
    return loss, grads, buffers, remat.reports(compiled)[0]


def assert_same(expected: dict, actual: dict, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=atol, rtol=rtol, msg=f"{what} {key}")


def check_against_eager(name: str, fraction: float, compiler: str, **overrides: object) -> remat.Report:
    return check_model_against_eager(*build(name, **overrides), fraction, compiler,
                                     top=planned(name, compiler, **overrides))


def check_model_against_eager(model: torch.nn.Module, inputs: tuple, fraction: float, compiler: str,
                              top: remat.Report | None = None) -> remat.Report:
    """Loss, grads and buffers of one step under a budget ``fraction`` of the way up equal eager's;
    ``top``: the model's plan with no budget, when already made."""
    if top is None:
        top = remat.plan(model, *inputs, compiler=compiler)
    budget = budget_between(top, fraction)
    reference = copy.deepcopy(model)
    loss_ref, grads_ref, buffers_ref = eager_step(reference, inputs)
    loss, grads, buffers, report = compiled_step(model, inputs, budget, compiler)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-4)
    assert_same(grads_ref, grads, "grad")
    assert_same(buffers_ref, buffers, "buffer")
    assert report.checked_peak_bytes <= report.planned_budget_bytes <= report.budget_bytes
    return report


@pytest.mark.parametrize("name", ["gpt", "gpt-softmax", "llama", "convnet"])
def test_inductor_matches_eager_under_a_binding_budget(name: str) -> None:
    report = check_against_eager(name, 0.3, "inductor", **INDUCTOR_SIZE.get(name, {}))
    assert report.recomputed, "a budget 30% of the way to store-all must force recomputation"


@pytest.mark.parametrize("name", ["gpt", "llama", "vit"])
def test_eager_partition_matches_eager_at_the_tightest_budget(name: str) -> None:
    check_against_eager(name, 0.0, "eager")


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_dropout_never_recomputed_with_fresh_randomness(compiler: str) -> None:
    with inductor_config.patch(fallback_random=True):  # planned under the patch too: not shared
        report = check_model_against_eager(*build("mlp-dropout"), 0.0, compiler)
    random_rows = [n for n in report.nodes if "kept: random op" in n.reason]
    assert random_rows, "the dropout masks must be kept, with the reason given"
    assert not any("dropout" in n.op or "bernoulli" in n.op for n in report.nodes if n.decision == "recomputed")


@pytest.mark.parametrize("name", ["hf-gpt2", "hf-llama", "hf-bert"])
def test_hugging_face_models_match_eager_at_the_tightest_budget(name: str) -> None:
    if not hf_models.available():
        pytest.skip("transformers is not installed (the test extra installs it)")
    model, inputs = hf_models.build(name, layers=2, d_model=64, heads=4, seq=32, vocab=128, batch=2)
    report = check_model_against_eager(model, inputs, 0.0, "eager")
    assert report.recomputed, "the smallest feasible budget must force recomputation"


def test_convnet_batchnorm_running_stats_match_eager() -> None:
    model, inputs = build("convnet")
    reference = copy.deepcopy(model)
    eager_step(reference, inputs)
    compiled_step(model, inputs, None, "eager")
    for (name, b_ref), (_, b) in zip(reference.named_buffers(), model.named_buffers()):
        torch.testing.assert_close(b, b_ref, msg=name)
