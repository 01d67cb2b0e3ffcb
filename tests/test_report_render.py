"""Reports for people: reasons, timelines, the table, the HTML card and the figure."""

from __future__ import annotations

import types

import json
import random
import sys

import pytest

from remat import solvers
from remat.frontier import capture
from remat.options import Options
from remat.render import scale, table_unit
from remat.report import downsample, node_rows, report_of
from remat.solvers.problem import Kind, Problem, Value
from tests.conftest import budget_between, build

RANDOM_BAN = "random op: recomputing it would draw new random numbers"


def tiny_problem(*, keep_operand: bool = False) -> Problem:
    """x -> mm -> relu (fused pointwise) and a dropout mask, all read by one backward step."""
    forward = dict(kind=Kind.FORWARD, last_use=2, need_start=3, need_end=3, direct_need=True)
    return Problem(values=(
        Value("x", Kind.INPUT, 256, 0, 3, op="input"),
        Value("mm", bytes=2**20, produced=0, op="aten.mm.default", category="matmul", seconds=8e-4, recompute_seconds=8e-4, **forward),
        Value("relu", bytes=2**20, produced=1, op="aten.relu.default", category="pointwise", operands=("mm",), seconds=1e-4,
              recompute_seconds=1e-5, save_seconds=1e-4, keep_operands=("mm",) if keep_operand else (), **forward),
        Value("mask", bytes=2**19, produced=2, op="aten.native_dropout.default", category="random", recompute_ban=RANDOM_BAN, **forward),
        Value("grad", Kind.BACKWARD, 2**20, 3, 3, op="aten.threshold_backward.default", category="pointwise"),
    ), num_forward_steps=3, num_steps=4)


def test_reasons_name_the_op_type_and_the_cost() -> None:
    problem = tiny_problem()
    rows = {r.name: r for r in node_rows(problem, solvers.evaluate(problem, {"mm", "mask"}))}
    assert rows["mm"].reason == "kept: matmul output, recompute would cost 0.8 ms"
    assert rows["relu"].reason == "recomputed: pointwise, fused into its consumer, frees 1 MiB"
    assert rows["mask"].reason == f"kept: {RANDOM_BAN}" and rows["mask"].category == "random"
    assert (rows["x"].decision, rows["grad"].decision) == ("input", "backward")
    assert [rows[n].category for n in ("x", "mm", "relu", "grad")] == ["input", "matmul", "pointwise", "pointwise"]
    assert rows["relu"].added_seconds == 1e-5 and rows["mm"].added_seconds == 0.0


def test_a_kept_operand_says_what_it_is_kept_for() -> None:
    problem = tiny_problem(keep_operand=True)
    rows = {r.name: r for r in node_rows(problem, solvers.evaluate(problem, {"mm", "mask"}))}
    assert rows["mm"].reason == "kept: matmul output, needed to recompute relu"


def test_downsample_keeps_every_bucket_maximum() -> None:
    rng = random.Random(0)
    line = tuple(rng.randrange(1000) for _ in range(10_007))
    steps, (points,) = downsample([line], limit=2000)
    assert len(points) == len(steps) <= 2000 and steps[0] == 0
    width = steps[1]
    assert points == [max(line[s:s + width]) for s in steps]
    assert max(points) == max(line)
    assert downsample([(1, 2, 3)]) == ([0, 1, 2], [[1, 2, 3]])


@pytest.fixture(scope="module")
def planned():
    """A GPT-style graph planned op by op under a budget that forces recomputation."""
    model, inputs = build("gpt")
    top = report_of(capture(model, inputs, Options(compiler="eager")))
    plan = capture(model, inputs, Options(compiler="eager", budget_gb=budget_between(top, 0.3)))
    return types.SimpleNamespace(report=report_of(plan), solution=plan.solution, problem=plan.problem)


def test_report_fields_agree_with_the_solution(planned) -> None:
    report, solution, problem = planned.report, planned.solution, planned.problem
    store_all = solvers.store_all(problem)
    assert report.predicted_peak_bytes == solution.peak_bytes <= report.budget_bytes
    assert set(report.saved) == solution.saved and set(report.recomputed) == solution.recomputed
    assert report.recomputed, "the budget must force recomputation"
    assert report.store_all_peak_bytes == store_all.peak_bytes
    assert report.predicted_overhead_seconds == pytest.approx(solution.added_seconds - store_all.added_seconds)
    assert sum(n.added_seconds for n in report.nodes) == pytest.approx(solution.added_seconds)
    assert len(report.timeline_steps) == len(report.plan_timeline) == len(report.store_all_timeline) <= 2000
    assert max(report.plan_timeline) == solution.peak_bytes
    assert max(report.store_all_timeline) == report.store_all_peak_bytes
    assert report.plan_timeline == [max(solution.timeline[s:e]) for s, e in
                                    zip(report.timeline_steps, report.timeline_steps[1:] + [problem.num_steps])]
    assert report.backward_starts_at == problem.num_forward_steps
    assert json.loads(report.to_json())["plan_timeline"] == report.plan_timeline


def test_every_decision_has_a_reason(planned) -> None:
    for row in planned.report.nodes:
        if row.decision in ("kept", "recomputed"):
            assert row.reason.startswith(row.decision + ": "), row
        if row.decision == "kept" and row.category == "matmul":
            assert row.reason.endswith(" ms") or "needed to recompute" in row.reason, row
        if row.decision == "recomputed" and row.bytes:
            assert "MiB" in row.reason, row


def test_to_pandas_has_one_row_per_node(planned) -> None:
    pytest.importorskip("pandas")
    report = planned.report
    table = report.to_pandas()
    assert len(table) == len(report.nodes)
    assert {"name", "op", "bytes", "flops", "seconds", "decision", "reason"} <= set(table.columns)
    assert table.set_index("name").loc[report.recomputed[0], "decision"] == "recomputed"
    assert table.bytes.sum() == sum(n.bytes for n in report.nodes)


def test_html_holds_the_numbers(planned) -> None:
    planned.report.min_feasible_bytes  # computed when first read (rendering computes nothing), whatever ran before
    report = planned.report.with_measured_peak(planned.report.predicted_peak_bytes + 2**20)
    report.notes.append("a <note>")  # the copy's own list
    page = report._repr_html_()
    assert "a &lt;note&gt;" not in planned.report._repr_html_()
    unit = table_unit(report)  # the card gives every figure of a table in one unit
    for nbytes in (report.budget_bytes, report.predicted_peak_bytes, report.store_all_peak_bytes,
                   report.min_feasible_bytes, report.predicted_peak_bytes + 2**20):
        assert unit(nbytes) in page
    assert report.solver in page and report.solver_status in page and "gap" in page
    recomputed = {n.category for n in report.nodes if n.decision == "recomputed"}
    assert all(category in page for category in recomputed)
    biggest = max((n for n in report.nodes if n.decision == "kept"), key=lambda n: n.bytes)
    assert biggest.name in page
    assert "a &lt;note&gt;" in page and "<note>" not in page


def test_plot_is_a_figure_with_the_budget_line(planned) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    report = planned.report
    fig = report.plot()
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    unit, _ = scale(report.store_all_timeline + report.plan_timeline + [report.budget_bytes])
    flat = {line.get_label(): set(line.get_ydata()) for line in ax.get_lines()}
    budget = [label for label, ys in flat.items() if ys == {report.budget_bytes / unit}]
    assert budget and budget[0].startswith("budget")
    labels = [line.get_label() for line in ax.get_lines()]
    assert "plan" in labels and "keep everything" in labels
    assert any(label.startswith("predicted peak") for label in labels)


def test_missing_optional_libraries_say_how_to_install_them(planned, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"to_pandas needs pandas: pip install 'remat\[notebook\]'"):
        planned.report.to_pandas()
    with pytest.raises(ImportError, match=r"plot needs matplotlib"):
        planned.report.plot()


@pytest.mark.parametrize("module", ["remat.report", "remat.passes.progress"])
def test_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_a_built_report_is_read_only_and_a_measurement_makes_a_copy(planned) -> None:
    report = planned.report
    with pytest.raises(AttributeError, match="read-only once built"):
        report.budget_bytes = 1
    measured = report.with_measured_peak(report.predicted_peak_bytes)
    assert measured.measured_peak_bytes == report.predicted_peak_bytes and report.measured_peak_bytes is None
    # figures still pending are computed for each copy when read, and agree
    assert measured.min_cut_overhead_seconds == report.min_cut_overhead_seconds
    assert measured.saved == report.saved and measured is not report
