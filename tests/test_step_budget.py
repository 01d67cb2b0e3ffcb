"""The budget is the training step's, as the caller runs it (``budget_scope`` "auto", the default).

Each test runs the step the way training loops are written (the loss computed outside the compiled
model, graph breaks, two compiled modules, gradient accumulation, evaluation between steps) and
measures its first and second steps as the budget counts them (``remat.measure.budget_peak``: the
allocator's peak during the step above what was allocated before it, plus the model's state and the
batch the model takes; the loss's targets, held by the caller before the step and read by no graph,
are the caller's, as optimizer state is): both within the budget, and the gradients equal eager's.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import remat
from remat.errors import GIB
from remat.measure import budget_peak
from remat.passes.scope.step import STEP

VOCAB, WIDTH, BATCH, SEQ = 512, 64, 8, 32


def lm() -> nn.Module:
    """A small language model returning logits (BATCH, SEQ, VOCAB): 512 KiB of them."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                         nn.Linear(4 * WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randint(VOCAB, (BATCH, SEQ)), torch.randint(VOCAB, (BATCH, SEQ))


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def smoothed(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Label smoothing written out by hand: a dense target and a product the logits' size."""
    dense = torch.full_like(out, 0.1 / VOCAB).scatter_(-1, y.unsqueeze(-1), 0.9)
    return -(out.log_softmax(-1) * dense).sum(-1).mean()


def squared(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A regression loss on every logit: the targets spread over the vocabulary."""
    return F.mse_loss(out, F.one_hot(y, VOCAB).float())


def steps_within(model: nn.Module, run: Callable[[], None], budget: int, *held: torch.Tensor,
                 steps: int = 2) -> list[int]:
    """Each step's peak as the budget counts it (the model's state and ``held`` tensors included);
    every one within ``budget``."""
    peaks = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        peaks.append(budget_peak(run, model, held, "cpu"))
    assert all(peak <= budget for peak in peaks), f"steps peaked at {peaks}, over the budget {budget}"
    return peaks


def assert_eager_gradients(model: nn.Module, reference: nn.Module, run_reference: Callable[[], None]) -> None:
    reference.zero_grad(set_to_none=True)
    run_reference()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda text: f"{name}: {text}")


def binding_budget(model: nn.Module, x: torch.Tensor, fraction: float = 0.3) -> int:
    """A budget ``fraction`` of the way from the smallest feasible to store-all, by ``remat.plan`` of the
    model alone (the eager code after it reserved, as before a first step)."""
    return remat.plan(model, x).budget_at(fraction)


@pytest.mark.parametrize("loss_fn", [cross_entropy, smoothed, squared], ids=["cross-entropy", "smoothed", "mse"])
def test_a_loss_outside_the_model_fits_on_the_first_step_and_after(loss_fn: Callable) -> None:
    model, (x, y) = lm(), batch()
    reference = copy.deepcopy(model)
    budget = binding_budget(model, x)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget / GIB)
    steps_within(model, lambda: loss_fn(compiled(x), y).backward(), budget, x, steps=3)
    (report,) = remat.reports(compiled)
    assert report.recomputed, "the budget must bind"
    assert report.budget_scope == "step" and report.eager_bytes > 0
    assert any("measured on the first step" in note for note in report.notes)
    assert_eager_gradients(model, reference, lambda: loss_fn(reference(x), y).backward())


def test_without_the_step_scope_a_loss_outside_puts_the_step_over_the_budget() -> None:
    """``budget_scope="graph"`` (opted into) bounds the graph's own step: the eager loss is not counted,
    and the step as run exceeds the budget (what the step scope prevents)."""
    model, (x, y) = lm(), batch()
    budget = remat.plan(model, x, budget_scope="graph").budget_at(0.0)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget / GIB, budget_scope="graph")
    model.zero_grad(set_to_none=True)
    compiled(x)  # compiled outside the measured step
    peak = budget_peak(lambda: cross_entropy(compiled(x), y).backward(), model, (x,), "cpu")
    (report,) = remat.reports(compiled)
    assert report.budget_scope == "graph" and report.eager_bytes == 0 and peak > budget


def test_a_plan_made_after_a_measured_step_counts_what_it_measured() -> None:
    """The window measured on a first step is remembered for the graph: ``remat.plan`` and a new compile of
    the same model count it instead of the reservation, and a budget at the smallest feasible then holds."""
    model, (x, y) = lm(), batch()
    reserved = remat.plan(model, x)
    torch._dynamo.reset()
    compiled = remat.compile(model)
    for _ in range(2):
        cross_entropy(compiled(x), y).backward()
    measured = remat.reports(compiled)[0].eager_bytes
    torch._dynamo.reset()
    after = remat.plan(model, x)
    assert after.eager_bytes == measured < reserved.eager_bytes  # three logits reserved, two measured
    torch._dynamo.reset()
    tight = remat.compile(model, budget_gb=after.min_feasible_bytes / GIB)
    steps_within(model, lambda: cross_entropy(tight(x), y).backward(), after.min_feasible_bytes, x)


def heavy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A loss holding more tensors the logits' size at once than remat reserves before a first step."""
    a, b, c = out.softmax(-1), out.sigmoid(), out.tanh()
    return cross_entropy(out, y) + (a * b * c).mean()


def test_a_loss_with_more_temporaries_than_reserved_is_counted_from_the_second_step(caplog) -> None:
    """The first step ran over the reservation: remat says by how much and plans again with what it
    measured, and from the second step the budget holds."""
    model, (x, y) = lm(), batch()
    logits = BATCH * SEQ * VOCAB * 4
    budget = binding_budget(model, x, 1.0) + 4 * logits  # room for the heavy loss, once measured
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget / GIB)
    model.zero_grad(set_to_none=True)
    heavy(compiled(x), y).backward()
    with caplog.at_level(logging.INFO):
        steps_within(model, lambda: heavy(compiled(x), y).backward(), budget, x)
    (report,) = remat.reports(compiled)
    assert report.eager_bytes > 3 * logits  # above the reservation
    assert not report.eager_reserved and any("measured" in note for note in report.notes)


def test_a_budget_the_measured_loss_cannot_fit_is_refused_at_the_second_step() -> None:
    model, (x, y) = lm(), batch()
    budget = binding_budget(model, x, 0.3)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget / GIB)
    heavy(compiled(x), y).backward()
    with pytest.raises(remat.BudgetError, match="eager parts of the step measured on the first step") as caught:
        compiled(x)
    assert caught.value.min_feasible_bytes > budget


class TwoGraphs(nn.Module):
    """A language model with a graph break after its first layers (a ``.item()`` and a print), scaled by a
    Python number (which torch's tracing keeps alive as an 8-byte tensor from the first step on)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = lm()[:4], lm()[4:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x) * 0.5
        if h.abs().max().item() > 1e6:
            print("diverged")
        return self.head(h)


def test_graphs_of_one_step_share_the_budget() -> None:
    model, (x, y) = TwoGraphs(), batch()
    reference = copy.deepcopy(model)
    unbudgeted = remat.compile(model)
    cross_entropy(unbudgeted(x), y).backward()
    # the step's peak without a budget: planned together, the graphs must recompute to fit it
    budget = max(steps_within(model, lambda: cross_entropy(unbudgeted(x), y).backward(), 2**40, x))
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget / GIB)
    steps_within(model, lambda: cross_entropy(compiled(x), y).backward(), budget, x, steps=3)
    reports = remat.reports(compiled)
    assert len(reports) == 2 and all(r.budget_scope == "step" and r.recomputed for r in reports)
    assert reports[1].graphs_bytes > 0  # the first graph's kept activations, while the second runs
    assert_eager_gradients(model, reference, lambda: cross_entropy(reference(x), y).backward())


def test_graphs_of_one_step_fit_at_the_smallest_feasible_budget_for_the_step() -> None:
    """At the tightest budget every byte counts: the second graph runs beside the first's kept values and
    the batch the first took (held by the caller through the step, taken by no other graph)."""
    model, (x, y) = TwoGraphs(), batch()
    warm = remat.compile(model)
    for _ in range(2):  # the first step measures the eager code, the second counts it
        cross_entropy(warm(x), y).backward()
    budget = max(r.min_feasible_bytes for r in remat.reports(warm))
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget / GIB)
    steps_within(model, lambda: cross_entropy(compiled(x), y).backward(), budget, x)
    assert remat.reports(compiled)[1].graphs_bytes >= x.nbytes


def test_two_modules_compiled_apart_share_the_budget() -> None:
    whole = TwoGraphs()
    reference = copy.deepcopy(whole)
    x, y = batch()
    budget = None
    for _ in range(2):  # unbudgeted (to measure the step), then under a budget at that peak
        torch._dynamo.reset()
        body = remat.compile(whole.body, budget_gb=None if budget is None else budget / GIB)
        head = remat.compile(whole.head, budget_gb=None if budget is None else budget / GIB)
        peaks = steps_within(whole, lambda: cross_entropy(head(body(x)), y).backward(), budget or 2**40, x,
                             steps=3)
        budget = budget or max(peaks)
    assert remat.reports(body)[0].other_state_bytes > 0  # the head's parameters, held while it runs
    assert any(remat.reports(part)[0].recomputed for part in (body, head))
    assert_eager_gradients(whole, reference, lambda: cross_entropy(reference.head(reference.body(x)), y).backward())


def test_gradient_accumulation_and_evaluation_between_steps_stay_within_the_budget() -> None:
    model, (x, y) = lm(), batch()
    reference = copy.deepcopy(model)
    budget = binding_budget(model, x)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget / GIB)
    halves = [(x[: BATCH // 2], y[: BATCH // 2]), (x[BATCH // 2:], y[BATCH // 2:])]

    def accumulate() -> None:
        for xs, ys in halves:
            (cross_entropy(compiled(xs), ys) / 2).backward()
        with torch.no_grad():  # an evaluation between steps: no plan, no window
            cross_entropy(compiled(x), y)

    steps_within(model, accumulate, budget, x)
    assert_eager_gradients(model, reference, lambda: [(cross_entropy(reference(xs), ys) / 2).backward()
                                                      for xs, ys in halves])


def test_the_registered_backend_counts_the_step_too() -> None:
    model, (x, y) = lm(), batch()
    budget = binding_budget(model, x)
    torch._dynamo.reset()
    before = len(remat.reports())
    compiled = torch.compile(model, backend="remat", options={"budget_gb": budget / GIB})
    steps_within(model, lambda: cross_entropy(compiled(x), y).backward(), budget, x)
    (report,) = remat.reports()[before:]
    assert report.budget_scope == "step" and report.eager_bytes > 0


def test_plan_with_the_loss_counts_it_as_the_step_will() -> None:
    """``remat.plan(..., loss_fn=)`` measures the loss on outputs shaped like the model's: the eager bytes
    it counts are those the first step then measures, and the caller's random stream is untouched."""
    model, (x, y) = lm(), batch()
    torch.manual_seed(3)
    report = remat.plan(model, x, loss_fn=lambda out: cross_entropy(out, y))
    drawn = torch.rand(4)
    torch.manual_seed(3)
    torch.testing.assert_close(drawn, torch.rand(4), rtol=0, atol=0)
    assert not report.eager_reserved and report.eager_bytes == 2 * BATCH * SEQ * VOCAB * 4 + 8  # (and the loss)
    torch._dynamo.reset()
    STEP.forget_measured()
    compiled = remat.compile(model)
    for _ in range(2):
        cross_entropy(compiled(x), y).backward()
    assert remat.reports(compiled)[0].eager_bytes == report.eager_bytes
