"""Regressions found by the random models of ``tests/random_models.py``."""

from __future__ import annotations

import torch

import remat
from tests.random_models import Case, Spec, run


def spec(**fields: object) -> Spec:
    base = dict(family="seq", blocks=(), batch=2, tokens=8, width=16, heads=4, dropout=0.5, act="gelu",
                inplace="relu_", autocast=False, extra_output=False)
    return Spec(**{**base, **fields})  # type: ignore[arg-type]


def test_batchnorm_on_a_transposed_input_runs_op_by_op() -> None:
    """case-8: the CPU batch-norm kernel returns a contiguous output where its
    fake kernel keeps the transposed input's strides; a ``view`` traced on the
    fake layout failed on the real one (torch's ``aot_eager`` fails the same way)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    bn = torch.nn.BatchNorm1d(16)

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(bn(x.transpose(1, 2)).transpose(1, 2)).float().square().mean()

    x = torch.randn(2, 8, 16)
    compiled = remat.compile(fn, budget_gb=None, compiler="eager")
    compiled(x).backward()
    assert len(remat.reports(compiled)) == 1


def regression(seed: int, fraction: float, **fields: object) -> list[str]:
    return run(Case(seed, spec(**fields), "eager", "measure", fraction)).problems


def test_dropout_backward_temporaries_are_counted() -> None:
    """case-1: on the CPU ``native_dropout_backward`` allocates a float copy of
    its mask and an intermediate product; pointwise ops were costed with no
    workspace and the measured peak exceeded the tightest budget."""
    assert not regression(1, 0.0, blocks=("mlp", "dropout", "mlp", "attention", "attention", "attention"),
                          batch=8, tokens=16, width=16, heads=1, inplace="mul_")


def test_layer_norm_backward_keeps_the_traced_layout() -> None:
    """case-6: layer norm's CPU backward returned another layout than traced;
    the convolution after it copied its gradient, over the budget."""
    assert not regression(6, 0.73, family="conv", blocks=("tokens", "act"), tokens=6, width=8, act="silu")


def test_values_read_from_a_buffer_the_forward_updates_are_not_recomputed() -> None:
    """case-25: at the tightest budget batch norm was recomputed in the
    backward from its running statistics, which the forward had already
    updated (autograd refused: "modified by an inplace operation")."""
    assert not regression(25, 0.0, blocks=("batchnorm", "dropout"), batch=8, tokens=16, dropout=0.1, act="silu")
    assert not regression(25, 0.0, blocks=("buffer", "mlp", "act"), batch=8, tokens=16, dropout=0.1)


def test_batch_norm_runs_decomposed_like_inductor() -> None:
    """case-143 (and 16 more with batch norm or bf16 autocast): op by op, the
    aten batch-norm kernel returned other strides than traced; copying its
    output into the traced layout held one more tensor than planned, and the
    measured peak exceeded the budget. The eager compiler now decomposes like
    Inductor, so no such kernel runs."""
    assert not regression(143, 0.841, blocks=("linear", "batchnorm"), heads=4, act="silu")
