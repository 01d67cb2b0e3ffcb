"""Whole programs from AOTAutograd's cache (passes/cache/program_cache.py): a warm compile of the
same graph and request loads its plan's program, nothing traced, profiled, solved or compiled;
another budget never loads a program compiled for another plan."""

from __future__ import annotations

import contextlib
import gc
import pathlib
import shutil

import pytest
import torch

import remat
import remat.backend
from remat.errors import GIB
from remat.measure import budget_peak
from remat.passes.decide import partition
from remat.passes.cache import program_cache
from remat.passes.decide.attempt import GraphSetting
from remat.passes import torch_adapter as adapter
from tests.conftest import budget_between, build, planned

MODEL = "gpt-softmax"  # one block: its plans differ between the budgets below
# the CPU step peaks of one program vary by a few bytes between steps (the autograd engine's own)
SAME_PEAK = 64


@pytest.fixture
def caches(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Inductor's and AOTAutograd's caches in a folder of the test's own; the plan folder beside."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "plans"


@pytest.fixture(scope="module")
def first_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, remat.Report, int]:
    """The first step at the tight budget (``_budgets()[0]``) in empty caches, made once for the
    tests that start from it: the folder holding its caches (``inductor``, ``plans``), its report
    and its measured peak. Each test works on a copy (``after_first_step``)."""
    folder = tmp_path_factory.mktemp("first-step")
    # the budget first, in the session's Inductor cache: in an empty one every kernel of the
    # plans behind it would be compiled by the C++ compiler again
    tight, _ = _budgets()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
        report, peak, _ = _step(folder / "plans", tight)
    return folder, report, peak


@pytest.fixture
def after_first_step(first_step: tuple[pathlib.Path, remat.Report, int], tmp_path: pathlib.Path,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[pathlib.Path, remat.Report, int]:
    """The caches as the first step left them, copied into the test's own folder (Inductor's and
    AOTAutograd's cache set to the copy, as ``caches`` sets them): the plan folder, and the first
    step's report and peak."""
    folder, report, peak = first_step
    shutil.copytree(folder / "inductor", tmp_path / "inductor")
    shutil.copytree(folder / "plans", tmp_path / "plans")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "plans", report, peak


def _forbid_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("traced, profiled or solved: the program was not loaded whole")

    monkeypatch.setattr(partition, "profile_graph", refuse)
    monkeypatch.setattr(partition, "solve", refuse)
    monkeypatch.setattr(partition.Planner, "choose", refuse)


def _step(plans: pathlib.Path, budget: float) -> tuple[remat.Report, int, torch.nn.Module]:
    """A fresh capture's first step at ``budget``: its report, its peak measured as the budget
    counts it, and the model (for its gradients)."""
    torch._dynamo.reset()
    model, inputs = build(MODEL, layers=1)
    compiled = remat.compile(model, budget_gb=budget, plan_cache=str(plans))
    # measured on the second step: the first one's CPU peak can read low (a block allocated
    # before it, freed during it)
    compiled(*inputs).backward()
    model.zero_grad(set_to_none=True)
    gc.collect()
    peak = budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cpu")
    (report,) = remat.reports(compiled)
    return report, peak, model


def _budgets() -> tuple[float, float]:
    report = planned(MODEL, "inductor", layers=1)
    return budget_between(report, 0.2), budget_between(report, 0.7)


def test_a_warm_compile_loads_its_program_whole(after_first_step: tuple[pathlib.Path, remat.Report, int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    budget, _ = _budgets()
    caches, first, first_peak = after_first_step
    assert first.plan_cache == "stored" and "program cache" in first.timings
    _forbid_planning(monkeypatch)
    again, peak, model = _step(caches, budget)
    assert again.plan_cache == "program" and list(again.timings) == ["cached program"]
    assert (again.saved, again.recomputed) == (first.saved, first.recomputed)
    # the loaded program is the plan's: it peaks where the first did, within the budget
    assert abs(peak - first_peak) <= SAME_PEAK and peak <= budget * GIB and again.compiled_peak_bytes == first.compiled_peak_bytes
    assert again.min_cut_peak_bytes is None and "nothing traced" in " ".join(again.notes)
    assert "(Inductor's, loaded with its plan)" in again.summary()
    eager, inputs = build(MODEL, layers=1)
    eager(*inputs).backward()
    for p, p_ref in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5)


def test_another_budget_never_loads_another_plans_program(
        after_first_step: tuple[pathlib.Path, remat.Report, int]) -> None:
    tight, loose = _budgets()
    caches, first, first_peak = after_first_step  # the step at ``tight``
    assert abs(first_peak - first.compiled_peak_bytes) <= SAME_PEAK
    other, other_peak, _ = _step(caches, loose)  # another request: planned, not loaded
    assert other.plan_cache == "stored" and other.recomputed != first.recomputed
    again, peak, _ = _step(caches, loose)  # loaded: the loose plan's program, not the tight one's
    assert again.plan_cache == "program" and again.recomputed == other.recomputed
    assert again.compiled_peak_bytes == other.compiled_peak_bytes != first.compiled_peak_bytes
    # each program peaks where its own plan's account says (the tight plan's would not)
    assert abs(other_peak - other.compiled_peak_bytes) <= SAME_PEAK
    assert abs(peak - other.compiled_peak_bytes) <= SAME_PEAK


def test_a_missing_program_is_planned_again_and_published(after_first_step: tuple[pathlib.Path, remat.Report, int],
                                                          tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    budget, _ = _budgets()
    caches, first, _ = after_first_step
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "emptied"))  # AOTAutograd's entry is gone
    again, peak, _ = _step(caches, budget)  # the plan from remat's cache, its program compiled again
    assert again.plan_cache == "hit" and again.recomputed == first.recomputed
    assert again.compiled_peak_bytes == first.compiled_peak_bytes
    third, _, _ = _step(caches, budget)
    assert third.plan_cache == "program"


def test_without_a_recorded_entry_the_accepted_plan_is_compiled_into_the_cache(
        caches: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the fitting loop's compile made no AOTAutograd entry (a cache bypass), publishing
    compiles the accepted plan once more with the cache on; the next compile loads it."""
    monkeypatch.setattr(adapter, "recording_program_entries", lambda: contextlib.nullcontext([]))
    budget, _ = _budgets()
    first, _, _ = _step(caches, budget)
    assert first.plan_cache == "stored" and "program cache" in first.timings
    again, peak, _ = _step(caches, budget)
    assert again.plan_cache == "program" and again.recomputed == first.recomputed
    assert abs(peak - first.compiled_peak_bytes) <= SAME_PEAK


def test_the_program_key_holds_what_a_plan_depends_on(caches: pathlib.Path) -> None:
    """Known before tracing: the graph, its inputs' shapes and grad flags, the request."""
    model, inputs = build(MODEL, layers=1)
    keys = []
    for budget in (0.5, 0.6):
        backend = remat.backend.RematBackend(remat.Options(budget_gb=budget, plan_cache=str(caches)))
        torch._dynamo.reset()
        gm_and_inputs = []
        torch.compile(model, backend=lambda gm, ex: gm_and_inputs.append((gm, ex)) or gm)(*inputs)
        (gm, example), = gm_and_inputs
        keys.append(program_cache.program_key(gm, example, backend.planner, GraphSetting()))
        example[1].requires_grad_(not example[1].requires_grad)
        keys.append(program_cache.program_key(gm, example, backend.planner, GraphSetting()))
        example[1].requires_grad_(not example[1].requires_grad)
    assert len({repr(k) for k in keys}) == 4
    assert keys[0] == program_cache.program_key(gm, example, remat.backend.RematBackend(
        remat.Options(budget_gb=0.5, plan_cache=str(caches))).planner, GraphSetting())


def test_off_without_the_plan_cache_or_aotautograds_cache(monkeypatch: pytest.MonkeyPatch,
                                                          caches: pathlib.Path) -> None:
    inputs = [torch.ones(2, 3)]
    on = remat.backend.RematBackend(remat.Options(budget_gb=1.0, plan_cache=str(caches)))
    assert program_cache.usable(on.planner, GraphSetting(), inputs)
    assert not program_cache.usable(
        remat.backend.RematBackend(remat.Options(budget_gb=1.0, plan_cache=False)).planner, GraphSetting(), inputs)
    assert not program_cache.usable(remat.backend.RematBackend(
        remat.Options(budget_gb=1.0, plan_cache=str(caches), compiler="eager")).planner, GraphSetting(), inputs)
    with torch.compiler.config.patch(force_disable_caches=True):
        assert not program_cache.usable(on.planner, GraphSetting(), inputs)
    with adapter.inductor_settings(post_grad_custom_post_pass=lambda graph: None):  # a pass of the user's
        assert not program_cache.usable(on.planner, GraphSetting(), inputs)


def test_a_graph_with_symbolic_sizes_is_planned_not_loaded(caches: pathlib.Path) -> None:
    """remat pins symbolic sizes when it plans; a program loaded whole would not."""
    model, inputs = build(MODEL, layers=1)
    compiled = remat.compile(model, budget_gb=1.0, plan_cache=str(caches), dynamic=True)
    compiled(*inputs).backward()
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=1.0, plan_cache=str(caches), dynamic=True)
    compiled(*inputs).backward()
    assert [r.plan_cache for r in remat.reports(compiled)] in (["hit"], ["stored"])
