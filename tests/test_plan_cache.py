"""The plan cache: a graph planned once is not solved again; bad files are ignored loudly."""

from __future__ import annotations

import copy
import json
import logging
import pathlib
import shutil

import pytest
import torch

import remat
from remat.passes.decide import partition
from remat.passes.cache import plan_cache
from remat.passes import torch_adapter as adapter
from tests.conftest import budget_between, build, planned


def _plan(folder: pathlib.Path | bool, budget: float | None = None) -> remat.Report:
    model, inputs = build("gpt")
    torch._dynamo.reset()
    return remat.plan(model, *inputs, budget_gb=budget, compiler="eager", plan_cache=str(folder)
                      if isinstance(folder, pathlib.Path) else folder)


def _forbid_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("planned again: the cached plan was not used")

    monkeypatch.setattr(partition, "profile_graph", refuse)
    monkeypatch.setattr(partition, "solve", refuse)


@pytest.fixture
def budget() -> float:
    return budget_between(planned("gpt", "eager"), 0.3)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, remat.Report]:
    """One entry, planned once into an empty folder (at ``budget``) for every test below that
    starts from a stored plan: each reads the folder, or copies it and works on the copy."""
    folder = tmp_path_factory.mktemp("stored")
    return folder, _plan(folder, budget_between(planned("gpt", "eager"), 0.3))


def _copy_of(stored: tuple[pathlib.Path, remat.Report], folder: pathlib.Path) -> remat.Report:
    """The stored entry copied into ``folder``; the report that stored it."""
    source, first = stored
    for path in source.glob("*.json"):
        shutil.copy(path, folder / path.name)
    return first


def test_a_graph_planned_once_is_loaded_not_solved(tmp_path: pathlib.Path, budget: float,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   stored: tuple[pathlib.Path, remat.Report]) -> None:
    folder, first = stored
    assert first.plan_cache == "stored" and len(list(folder.glob("*.json"))) == 1
    _copy_of(stored, tmp_path)
    _forbid_planning(monkeypatch)
    again = _plan(tmp_path, budget)
    assert again.plan_cache == "hit"
    assert (again.saved, again.recomputed, again.predicted_peak_bytes) == (
        first.saved, first.recomputed, first.predicted_peak_bytes)


def test_a_cached_plan_compiles_to_eager_gradients(tmp_path: pathlib.Path, budget: float,
                                                   stored: tuple[pathlib.Path, remat.Report]) -> None:
    model, inputs = build("gpt")
    reference = copy.deepcopy(model)
    reference(*inputs).backward()
    _copy_of(stored, tmp_path)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=budget, compiler="eager", plan_cache=str(tmp_path))
    compiled(*inputs).backward()
    (report,) = remat.reports(compiled)
    assert report.plan_cache == "hit" and report.realized_peak_bytes <= report.planned_budget_bytes
    for p, p_ref in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad)


def test_another_budget_is_another_entry(tmp_path: pathlib.Path, budget: float,
                                         stored: tuple[pathlib.Path, remat.Report]) -> None:
    _copy_of(stored, tmp_path)  # the entry for ``budget``
    assert _plan(tmp_path, budget * 1.5).plan_cache == "stored"
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_entries_are_plain_json_with_their_key(stored: tuple[pathlib.Path, remat.Report]) -> None:
    folder, report = stored
    (path,) = folder.glob("*.json")
    entry = json.loads(path.read_text())
    assert entry["key"]["budget_bytes"] == report.budget_bytes and entry["key"]["torch"] == torch.__version__
    assert sorted(entry["saved"]) == sorted(report.saved) and len(entry["checksum"]) == 64


def _rewrite(path: pathlib.Path, change: object) -> None:
    entry = json.loads(path.read_text())
    change(entry)
    path.write_text(json.dumps(entry))


def _refresh_checksum(entry: dict) -> None:
    body = {k: v for k, v in entry.items() if k != "checksum"}
    entry["checksum"] = plan_cache._digest(body)


@pytest.mark.parametrize(
    ("damage", "warning"),
    [
        (lambda path: path.write_text("{not json"), "ignoring plan cache file"),
        (lambda path: _rewrite(path, lambda e: e["saved"].append("mm")), "checksum"),
        (lambda path: _rewrite(path, lambda e: (e["key"].update(torch="0.0"), _refresh_checksum(e))),
         "another graph"),
        (lambda path: _rewrite(path, lambda e: (e["saved"].append("no_such_node"), _refresh_checksum(e))),
         "lacks"),
    ],
    ids=["corrupt", "edited", "foreign", "stale-names"],
)
def test_bad_files_are_ignored_with_a_warning_and_replaced(tmp_path: pathlib.Path, budget: float, damage: object,
                                                           warning: str, caplog: pytest.LogCaptureFixture,
                                                           stored: tuple[pathlib.Path, remat.Report]) -> None:
    folder, first = stored
    (original,) = folder.glob("*.json")
    path = tmp_path / original.name
    shutil.copy(original, path)
    damage(path)
    with caplog.at_level(logging.WARNING, logger="remat.passes.cache.plan_cache"):
        again = _plan(tmp_path, budget)
    assert warning in caplog.text
    assert again.plan_cache == "stored" and again.saved == first.saved
    assert json.loads(path.read_text())["checksum"]  # rewritten whole


def test_switches(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plan_cache.cache_dir(False) is None
    assert plan_cache.cache_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv("REMAT_PLAN_CACHE", "off")
    assert plan_cache.cache_dir(True) is None
    monkeypatch.setenv("REMAT_PLAN_CACHE", str(tmp_path / "env"))
    assert plan_cache.cache_dir(True) == tmp_path / "env"
    monkeypatch.delenv("REMAT_PLAN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert plan_cache.cache_dir(True) == tmp_path / "xdg" / "remat" / "plans"
    assert _plan(False).plan_cache == ""
    with pytest.raises(ValueError, match="plan_cache must be"):
        remat.Options(plan_cache=3)  # type: ignore[arg-type]


def test_an_unwritable_folder_warns_and_plans(tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="remat.passes.cache.plan_cache"):
        report = _plan(blocker / "plans")
    assert report.plan_cache == "" and "could not write the plan cache" in caplog.text


ACCOUNTED = "gpt-softmax"


def _compile_step(folder: pathlib.Path | bool, budget: float) -> tuple[remat.Report, dict[str, int], torch.nn.Module]:
    """One step of the one-block softmax GPT under Inductor (its plans differ between the two
    budgets below); its report, Inductor's FX graph cache hits and misses during it, and the
    model (for its gradients)."""
    torch._dynamo.reset()
    model, inputs = build(ACCOUNTED, layers=1)
    before = adapter.fx_graph_cache_counts()
    compiled = remat.compile(model, budget_gb=budget, plan_cache=folder if isinstance(folder, bool) else str(folder))
    compiled(*inputs).backward()
    after = adapter.fx_graph_cache_counts()
    (report,) = remat.reports(compiled)
    return report, {k: after[k] - before[k] for k in after}, model


@pytest.fixture(scope="module")
def first_compile(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, remat.Report, dict[str, int]]:
    """The first compile at 0.2 of the way up, in an empty Inductor cache (``inductor``) and
    plan folder (``plans``), made once for the two tests below that start from it: the folder,
    the report, and Inductor's cache hits and misses during it."""
    folder = tmp_path_factory.mktemp("first-compile")
    # the budget first, in the session's Inductor cache: in an empty one every kernel of the
    # plans behind it would be compiled by the C++ compiler again
    budget = budget_between(planned(ACCOUNTED, "inductor", layers=1), 0.2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
        first, counts, _ = _compile_step(folder / "plans", budget)
    return folder, first, counts


def _after_first_compile(first_compile: tuple[pathlib.Path, remat.Report, dict[str, int]], tmp_path: pathlib.Path,
                         monkeypatch: pytest.MonkeyPatch) -> tuple[remat.Report, dict[str, int]]:
    """The caches as the first compile left them, copied into ``tmp_path`` (``inductor``, Inductor's
    cache set to it, and ``plans``); its report and cache counts."""
    folder, first, counts = first_compile
    shutil.copytree(folder / "inductor", tmp_path / "inductor")
    shutil.copytree(folder / "plans", tmp_path / "plans")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return first, counts


def test_a_plan_from_the_cache_loads_its_program_from_inductors_cache(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        first_compile: tuple[pathlib.Path, remat.Report, dict[str, int]]) -> None:
    report = planned(ACCOUNTED, "inductor", layers=1)
    budget, other_budget = budget_between(report, 0.2), budget_between(report, 0.7)
    first, counts = _after_first_compile(first_compile, tmp_path, monkeypatch)
    assert first.plan_cache == "stored" and counts["hit"] == 0 and first.compiled_peak_bytes
    assert list(first.timings) == ["capture", "profile", "solve", "inductor", "program cache"]
    # a second compile: remat's plan and the programs Inductor generated for it are both loaded
    # (whole, through AOTAutograd's cache: tests/test_program_cache.py)
    again, counts, model = _compile_step(tmp_path / "plans", budget)
    assert again.plan_cache == "program" and counts == {"hit": 2, "miss": 0}
    assert list(again.timings) == ["cached program"]  # nothing traced, profiled, solved or compiled
    assert (again.recomputed, again.compiled_peak_bytes) == (first.recomputed, first.compiled_peak_bytes)
    eager_model, inputs = build(ACCOUNTED, layers=1)
    eager_model(*inputs).backward()
    for p, p_ref in zip(model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5)
    # another budget is another plan, and its account is its own program's: the same as in an
    # empty Inductor cache (a hit here is a plan the fitting loop compiled on its way to the first)
    other, _, _ = _compile_step(tmp_path / "plans", other_budget)
    assert other.plan_cache == "stored" and other.recomputed != first.recomputed
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "empty-inductor"))
    alone, counts, _ = _compile_step(False, other_budget)
    assert counts["hit"] == 0 and alone.recomputed == other.recomputed  # costs are cached per process
    assert other.compiled_peak_bytes == alone.compiled_peak_bytes != first.compiled_peak_bytes


def test_a_program_from_inductors_cache_without_a_stored_account_is_generated_again(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        first_compile: tuple[pathlib.Path, remat.Report, dict[str, int]]) -> None:
    """Another plan cache (or none) while Inductor's cache holds the program (an earlier process
    compiled the same plan): remat compiles the same plan again, uncached, to read its account."""
    budget = budget_between(planned(ACCOUNTED, "inductor", layers=1), 0.2)
    first, _ = _after_first_compile(first_compile, tmp_path, monkeypatch)
    calls = []
    real_solve = partition.solve
    monkeypatch.setattr(partition, "solve", lambda *a, **k: calls.append(1) or real_solve(*a, **k))
    again, counts, _ = _compile_step(tmp_path / "other-plans", budget)  # costs are cached per process: the same plan
    assert again.plan_cache == "stored" and again.recomputed == first.recomputed
    # Inductor's program found, then generated for the same plan: one solve per plan compiled
    assert counts["hit"] >= 1 and len(calls) == again.compile_attempts
    assert again.compiled_peak_bytes == first.compiled_peak_bytes


def test_the_version_covers_the_torch_adapter() -> None:
    """Inductor's fusion rules and the program account live in the adapter package: a plan
    stored before they changed is another version's."""
    from remat.passes.modeling import problem
    from remat.passes.torch_adapter import inductor_order

    sources = {path.resolve() for path in plan_cache.plan_sources()}
    assert pathlib.Path(inductor_order.__file__).resolve() in sources
    assert pathlib.Path(plan_cache.__file__).resolve() in sources
    assert pathlib.Path(problem.__file__).resolve() in sources  # every stage's subpackage, not the cache's alone
