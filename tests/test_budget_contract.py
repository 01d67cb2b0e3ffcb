"""The budget contract, measured: the allocator's real peak during a compiled
step, plus the graph's inputs, stays within the budget (CPU profiler)."""

from __future__ import annotations

import functools

import pytest
import torch

import remat
from remat.measure import budget_peak
from tests.conftest import INDUCTOR_SIZE, budget_between, build, planned


@functools.cache  # the prediction test reads the step the gpt budget test measured
def measured_step(name: str, fraction: float, compiler: str) -> tuple[int, remat.Report]:
    size = INDUCTOR_SIZE.get(name, {}) if compiler == "inductor" else {}
    model, inputs = build(name, **size)
    budget = budget_between(planned(name, compiler, **size), fraction)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget, compiler=compiler)
    compiled(*inputs).backward()  # compile outside the measured step
    model.zero_grad(set_to_none=True)  # produced gradients count, as the contract says
    return budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cpu"), remat.reports(compiled)[0]


@pytest.mark.parametrize("name", ["gpt", "llama", "convnet"])
@pytest.mark.parametrize("fraction", [0.05, 0.5])
def test_unfused_step_peaks_exactly_as_predicted(name: str, fraction: float) -> None:
    measured, report = measured_step(name, fraction, "eager")
    assert measured <= report.budget_bytes
    assert abs(measured - report.predicted_peak_bytes) <= 0.01 * report.predicted_peak_bytes


@pytest.mark.parametrize("name", ["gpt", "llama", "convnet"])
def test_inductor_step_stays_within_budget(name: str) -> None:
    measured, report = measured_step(name, 0.05, "inductor")
    assert measured <= report.budget_bytes, f"measured {measured} over budget {report.budget_bytes}"


def test_inductor_prediction_within_ten_percent_on_gpt() -> None:
    measured, report = measured_step("gpt", 0.05, "inductor")
    assert abs(measured - report.predicted_peak_bytes) <= 0.1 * report.predicted_peak_bytes
