"""CUDA checks: run on a machine with a GPU (skipped elsewhere).

    python -m pytest -q -m cuda tests/test_cuda.py
"""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.measure import budget_peak
from remat.zoo import build
from tests.conftest import budget_between

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SIZE = {"layers": 4, "d_model": 256, "heads": 8, "seq": 256, "vocab": 4096, "batch": 8}


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_cuda_gradients_match_eager_and_peak_within_budget(name: str) -> None:
    model, inputs = build(name, device="cuda", **SIZE)
    reference = copy.deepcopy(model)
    reference(*inputs).backward()
    budget = budget_between(remat.plan(model, *inputs), 0.3)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget)
    compiled(*inputs).backward()
    for (key, p_ref), (_, p) in zip(reference.named_parameters(), model.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=2e-4, rtol=2e-3, msg=key)
    model.zero_grad(set_to_none=True)
    measured = budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cuda")
    report = remat.reports(compiled)[0]
    assert measured <= report.budget_bytes, (measured, report.budget_bytes, report.predicted_peak_bytes)


def test_cuda_profile_measures_time_and_workspace() -> None:
    model, inputs = build("gpt", device="cuda", **SIZE)
    report = remat.plan(model, *inputs)
    matmuls = [n for n in report.nodes if n.op.startswith("aten.mm") or n.op.startswith("aten.addmm")]
    assert matmuls and all(n.seconds > 0 for n in matmuls)
    assert report.device.startswith("cuda")


def test_cuda_warm_compile_loads_its_program_whole(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second compile of a graph at the same budget loads the plan's program from AOTAutograd's
    cache (passes/program_cache.py), and that program peaks where the first one did."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    size = {**SIZE, "layers": 1}
    model, inputs = build("gpt", device="cuda", **size)
    budget = budget_between(remat.plan(model, *inputs, plan_cache=False), 0.3)
    peaks, reports = [], []
    for _ in range(2):
        torch._dynamo.reset()
        model, inputs = build("gpt", device="cuda", **size)
        compiled = remat.compile(model, budget_gb=budget, plan_cache=str(tmp_path / "plans"))
        compiled(*inputs).backward()
        model.zero_grad(set_to_none=True)
        peaks.append(budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cuda"))
        reports.append(remat.reports(compiled)[0])
    assert [r.plan_cache for r in reports] == ["stored", "program"]
    assert reports[1].recomputed == reports[0].recomputed and peaks[1] == peaks[0] <= reports[0].budget_bytes
