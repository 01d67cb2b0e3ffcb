"""CUDA checks: run on a machine with a GPU (skipped elsewhere).

    python -m pytest -q -m cuda tests/test_cuda.py
"""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.measure import budget_peak, step_peak
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
    cache (passes/cache/program_cache.py), and that program peaks where the first one did."""
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


def test_cuda_first_step_leaves_the_callers_peak_statistic_and_memory_history_as_they_were() -> None:
    """remat's first step measures every op (workspace included) without resetting the allocator's peak:
    a caller who allocated 1 GiB before it still reads at least that; the memory history the caller
    records keeps recording through it."""
    torch.cuda.reset_peak_memory_stats()
    big = torch.empty(2**28, device="cuda")  # 1 GiB, freed before the step
    del big
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        model, inputs = build("gpt", device="cuda", **{**SIZE, "layers": 1, "seq": 64})
        compiled = remat.compile(model, plan_cache=False)
        compiled(*inputs).backward()
        after = torch.ones(12345, device="cuda")
        traces = torch.cuda.memory._snapshot()["device_traces"]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert torch.cuda.max_memory_allocated() >= 2**30
    sizes = [entry["size"] for device in traces for entry in device if entry["action"] == "alloc"]
    assert after.untyped_storage().nbytes() in {-(-size // 512) * 512 for size in sizes} | set(sizes)


def test_cuda_step_peak_from_remats_own_session_equals_the_allocators_statistic() -> None:
    """``remat.measure.step_peak`` reads the step's peak from a profiler session of remat's own (never
    resetting the caller's statistics); on a repeatable step it equals what the allocator reports."""
    model, inputs = build("gpt", device="cuda", **{**SIZE, "layers": 1})
    compiled = remat.compile(model, budget_gb=budget_between(remat.plan(model, *inputs), 0.3))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        compiled(*inputs).backward()

    step()
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    allocator = torch.cuda.max_memory_allocated() - before
    assert step_peak(step, "cuda") == allocator


def test_cuda_eager_window_is_read_without_resetting_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks compiled one by one under a rank scope (stood in for FSDP2's): the head and loss are read
    from the allocator's statistics on the first step and counted from the second, and the peak the
    caller reads around the first step is not reset by it."""
    from remat.passes.scope import rank_scope

    monkeypatch.setattr(rank_scope, "scope_of", lambda gm, inputs, scope: rank_scope.RankScope("FSDP2", copies=1))
    model, inputs = build("gpt", device="cuda", **{**SIZE, "layers": 2, "seq": 64})
    torch._dynamo.reset()
    before = len(remat.reports())
    for block in model.blocks:
        block.compile(backend="remat", options={"budget_gb": 1.0, "plan_cache": False})
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    big = torch.empty(2**28, device="cuda")
    del big
    model(*inputs).backward()
    assert torch.cuda.max_memory_allocated() - base >= 2**30
    model.zero_grad(set_to_none=True)
    model(*inputs).backward()
    (report,) = remat.reports()[before:]
    assert report.eager_bytes > 0


def test_cuda_a_loss_outside_the_model_fits_on_the_first_step_and_after() -> None:
    """The step budget on CUDA: the eager window read from the allocator's statistics (never reset), the
    loss outside the model counted from the second step; both steps within the budget as the caller's
    own ``max_memory_allocated`` reads them."""
    from remat.zoo import build_loss_outside

    run = build_loss_outside("gpt", device="cuda", **{**SIZE, "layers": 2})
    budget = remat.plan(run.model, *run.inputs).budget_at(0.3)
    torch._dynamo.reset()
    compiled = remat.compile(run.model, budget_gb=budget / 2**30)
    state = sum(t.numel() * t.element_size() for t in [*run.model.parameters(), *run.inputs])
    for _ in range(2):
        run.model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # (the caller's own reading: remat never resets it)
        run.step(compiled)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before + state <= budget
    (report,) = remat.reports(compiled)
    assert report.budget_scope == "step" and report.eager_bytes > 0 and not report.eager_reserved
