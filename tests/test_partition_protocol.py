"""The partitioner protocol: every backward torch builds must belong to a remat plan."""

from __future__ import annotations

import contextlib

import pytest

import remat
from remat.passes import torch_adapter as adapter
from tests.conftest import build


def test_a_backward_no_plan_owns_is_a_plan_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """If torch stopped asking remat for the saved set, torch's own plan would compile under
    remat's name with no report: remat refuses instead."""
    monkeypatch.setattr(adapter, "saved_values_chooser", lambda choose: contextlib.nullcontext())
    model, inputs = build("gpt", layers=1)
    compiled = remat.compile(model, compiler="eager")
    with pytest.raises(remat.PlanError, match="no remat plan owns"):
        compiled(*inputs).backward()


def test_with_the_chooser_in_place_the_same_model_plans_and_reports() -> None:
    model, inputs = build("gpt", layers=1)
    compiled = remat.compile(model, compiler="eager")
    compiled(*inputs).backward()
    (report,) = remat.reports(compiled)
    assert report.realized_peak_bytes is not None and report.nodes
