"""A Report in the user's own names (modules, parameters, source lines), in one vocabulary
across the summary, the table, the card and the dict, and rendered without computing anything."""

from __future__ import annotations

import inspect
import json
import pathlib
import re
import types

import pytest
import torch
from torch import nn

import remat
from remat.errors import GIB
from remat.passes.program import fit
from remat.passes.decide import partition
from remat.passes import torch_adapter as adapter
from remat.render import COLUMNS, Unit, table_unit
from remat.report import NodeRow, Report
from remat.solvers import plan as policy

D, T = 16, 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x)
        k = self.k_proj(x)
        scores = q @ k.transpose(-1, -2)
        attn = scores.softmax(-1)
        return attn @ self.v_proj(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        hidden = torch.tanh(self.fc1(x))
        return x + self.fc2(hidden)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(D, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x).square().mean()


def line_of(code: str) -> str:
    """``file.py:N`` of the line of this file holding ``code``."""
    lines, start = inspect.getsourcelines(Attention)
    here = pathlib.Path(__file__).name
    return next(f"{here}:{start + i}" for i, text in enumerate(lines) if code in text)


@pytest.fixture(scope="module")
def planned() -> types.SimpleNamespace:
    """Net planned op by op under a budget that forces recomputation, and its joint graph."""
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, T, D)
    graphs = []
    choose = partition.Planner.choose

    def seeing(self, attempt, joint_graph, node_info):  # type: ignore[no-untyped-def]
        graphs.append(joint_graph)
        return choose(self, attempt, joint_graph, node_info)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partition.Planner, "choose", seeing)
        top = remat.plan(net, x, compiler="eager", plan_cache=False)
        report = remat.plan(net, x, compiler="eager", plan_cache=False, budget_gb=top.budget_at(0.3) / GIB)
    return types.SimpleNamespace(net=net, report=report, graph=graphs[-1], rows={n.name: n for n in report.nodes})


def innermost(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return re.sub(r"^L\['[^']+'\]\.?", "", list(stack.values())[-1][0]) if stack else ""


def test_parameters_carry_their_own_names(planned) -> None:
    params = dict(planned.net.named_parameters())
    inputs = [n for n in planned.report.nodes if n.decision == "input"]
    assert {n.input_name for n in inputs} == set(params) | {"x"}
    for row in inputs:
        if row.input_name in params:
            assert row.module == row.input_name.rpartition(".")[0]
            assert row.bytes == params[row.input_name].nbytes
    # each name is the right parameter: the ops that read it ran in the module that owns it
    for node in planned.graph.find_nodes(op="placeholder"):
        row = planned.rows.get(node.name)
        if row is None or not row.input_name.endswith("weight"):
            continue
        readers = {innermost(user) for user in node.users}
        assert readers == {row.module}, (row.input_name, readers)


def test_ops_carry_their_module_label_and_source_line(planned) -> None:
    rows = planned.report.nodes
    modules = set(dict(planned.net.named_modules()))
    assert all(n.module in modules for n in rows), {n.module for n in rows} - modules
    q_proj = [n for n in rows if n.op == "aten.addmm.default" and n.module == "layers.1.attn.q_proj"]
    assert q_proj and q_proj[0].label == "q_proj" and q_proj[0].source == line_of("q = self.q_proj(x)")
    softmax = [n for n in rows if n.module == "layers.0.attn" and n.source == line_of("attn = scores.softmax")]
    assert softmax and {n.label for n in softmax} == {"attn"}
    # the backward's ops are named for the module whose forward they differentiate
    assert any(n.decision == "backward" and n.module == "layers.0.fc2" for n in rows)
    # Net's own code ran in no submodule; rows with no name at all (a gradient sum) claim none
    top = [n for n in rows if n.decision != "input" and n.module == "" and n.source]
    assert top and all(n.source.startswith("test_report_names.py:") for n in top)
    assert {n.label for n in top if n.decision != "backward"} == {"pow", "mean"}  # square() is pow


def test_the_module_at_the_peak_is_named_in_the_plot(planned) -> None:
    report = planned.report
    assert report.peak_module and report.peak_module in set(dict(planned.net.named_modules()))
    pytest.importorskip("matplotlib")
    labels = [line.get_label() for line in report.plot().axes[0].get_lines()]
    assert any(label.startswith("predicted peak") and label.endswith(f" in {report.peak_module}") for label in labels)


def test_the_plot_names_each_layer_along_the_step(planned) -> None:
    spans = planned.report.module_spans
    groups = [group for _, _, group in spans]
    assert groups[:3] == ["layers.0", "layers.1", "head"]  # the forward in order, then the backward
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    pytest.importorskip("matplotlib")
    texts = {t.get_text() for t in planned.report.plot().axes[0].texts}
    assert {"layers.0", "layers.1"} <= texts


def figures_in(text: str) -> list[str]:
    return re.findall(r"-?\d+\.\d{3} [KMG]iB", text)


def test_summary_card_table_and_dict_agree(planned) -> None:
    pandas = pytest.importorskip("pandas")
    report = planned.report.with_measured_peak(None)  # a copy: its figures computed for it alone
    low = report.min_feasible_bytes
    fb = table_unit(report)
    text, page, data = report.summary(), report._repr_html_(), report.to_dict()
    first, *rows = text.splitlines()
    assert first.startswith("fits: peak ") and first == text.splitlines()[0]
    for figure in (report.peak_bytes, report.budget_bytes, report.store_all_peak_bytes, low):
        assert fb(figure) in text and fb(figure) in page
    assert data["min_feasible_bytes"] == low and data["budget_bytes"] == report.budget_bytes
    assert text.count("smallest feasible") == 1 and page.count("smallest feasible") == 1
    body = "\n".join(r for r in rows if not r.startswith("note:"))
    assert {f.split()[1] for f in figures_in(body)} == {fb.name}  # one unit for the whole summary
    table = report.to_pandas()
    assert list(table.module) == [n.module for n in report.nodes] == [r["module"] for r in data["nodes"]]
    assert list(table.label) == [n.label for n in report.nodes] and set(table.columns) == set(COLUMNS)
    groups = report.by_module()
    assert list(report.to_pandas(by_module=True).module) == [g["module"] for g in groups]
    assert sum(g["kept_bytes"] for g in groups) == sum(n.bytes for n in report.nodes if n.decision == "kept")
    for group in groups[:3]:
        assert f"{group['module'] or '(no submodule recorded)'}: " in text
        assert (group["module"] or "(no submodule recorded)") in page
    assert isinstance(pandas.DataFrame, type)


def test_rendering_computes_nothing(planned, monkeypatch: pytest.MonkeyPatch) -> None:
    report = planned.report.with_measured_peak(None)  # pending figures its own
    pending = report.pending
    assert "min_feasible_bytes" in pending
    calls = []
    for module, name in ((policy, "smallest_peak"), (adapter, "min_cut_saved_values"), (fit, "compile_once")):
        monkeypatch.setattr(module, name, lambda *a, _name=name, **k: calls.append(_name))
    text = report.summary()
    report._repr_html_()
    if pytest.importorskip("pandas"):
        report.to_pandas(), report.to_pandas(by_module=True)
    assert calls == [] and report.pending == pending
    assert "smallest feasible budget  not computed (read report.min_feasible_bytes" in text
    assert "not computed (read report.min_cut_peak_bytes and report.peer_rules)" in text


def test_to_html_and_save_write_the_card_and_the_dict(planned, tmp_path: pathlib.Path) -> None:
    report = planned.report.with_measured_peak(None)
    page = report.to_html(tmp_path / "card.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and report._repr_html_() in page and report.pending
    lazy = json.loads(report.save(tmp_path / "lazy.json", compute=False).read_text())
    assert lazy["min_feasible_bytes"] is None and "min_feasible_bytes" in lazy["pending"]
    saved = json.loads(report.save(tmp_path / "report.json").read_text())
    assert saved == json.loads(report.to_json()) and saved["min_feasible_bytes"] == report.min_feasible_bytes
    assert [n["module"] for n in saved["nodes"]] == [n.module for n in report.nodes]


def hand_report(**fields: object) -> Report:
    """A Report with two rows, made by hand: no graph, no compile."""
    nodes = [NodeRow("mm", "aten.mm.default", 3 * 2**20, 0.0, 4e-3, "kept", "kept: matmul output", "matmul",
                     module="layers.0.fc1", label="fc1"),
             NodeRow("relu", "aten.relu.default", 2**20, 0.0, 1e-3, "recomputed", "recomputed: pointwise",
                     "pointwise", module="layers.0", label="hidden")]
    base = dict(budget_bytes=8 * 2**20, predicted_peak_bytes=6 * 2**20, store_all_peak_bytes=7 * 2**20,
                predicted_overhead_seconds=1e-4, solver="ilp", solver_status="optimal", solve_seconds=0.0,
                mip_gap=0.0, nodes=nodes)
    return Report(**{**base, **fields})


def test_the_first_line_states_the_outcome() -> None:
    fits = hand_report()
    assert fits.summary().splitlines()[0] == ("fits: peak 6.000 MiB (predicted) under a 8.000 MiB budget "
                                              "(store-all 7.000 MiB), +2.0 % step time (predicted)")
    over = fits.with_measured_peak(9 * 2**20)
    assert over.summary().splitlines()[0] == "over budget: peak 9.000 MiB (measured) above the 8.000 MiB budget by 1.000 MiB"
    compiled = hand_report(compiled_peak_bytes=5 * 2**20)
    assert compiled.summary().splitlines()[0].startswith("fits: peak 5.000 MiB (compiled program) under")
    assert "layers.0.fc1: keeps fc1 (3.000 MiB)" in fits.summary()
    assert "layers.0: recomputes hidden (1.000 MiB)" in fits.summary()


def test_negative_added_time_is_explained() -> None:
    faster = hand_report(predicted_overhead_seconds=-2e-4)
    text = faster.summary()
    assert "4.0 % faster than store-all" in text.splitlines()[0]
    assert "-0.200 ms per step vs store-all" in text and "faster than store-all, which writes out" in text


def test_one_unit_per_table() -> None:
    assert Unit.of([3 * 2**30, 5 * 2**20])(5 * 2**20) == "0.005 GiB"
    assert Unit.of([3 * 2**20, 5 * 2**10])(5 * 2**10) == "0.005 MiB"


def test_hugging_face_modules_keep_their_own_names() -> None:
    pytest.importorskip("transformers")
    from bench import hf_models

    model, inputs = hf_models.build("hf-llama", layers=1, d_model=32, heads=2, seq=8, vocab=64, batch=1)
    report = remat.plan(model, *inputs, compiler="eager", plan_cache=False)
    modules = {n.module for n in report.nodes}
    assert "hf.model.layers.0.self_attn" in modules and "hf.model.layers.0.mlp.down_proj" in modules
    params = {n.input_name for n in report.nodes if n.decision == "input"}
    assert "hf.model.layers.0.self_attn.q_proj.weight" in params
    assert modules <= set(dict(model.named_modules()))


def test_reasons_name_other_values_as_the_user_does(planned) -> None:
    nodes = set(planned.rows)
    kept_for = [n.reason.split("needed to recompute ")[1] for n in planned.report.nodes
                if "needed to recompute" in n.reason]
    assert kept_for and not nodes & set(kept_for)
    assert all(" in layers." in text or "." not in text for text in kept_for)


def test_docstring_examples() -> None:
    import doctest

    from remat.passes.capture import names

    result = doctest.testmod(names)
    assert result.attempted > 0 and result.failed == 0


def test_a_cached_plan_takes_its_names_from_the_graph_it_plans(tmp_path: pathlib.Path) -> None:
    """The plan cache keys on the graph's ops and shapes, not on names: a hit is named anew."""
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, T, D)
    first = remat.plan(net, x, compiler="eager", plan_cache=str(tmp_path))
    torch._dynamo.reset()
    again = remat.plan(net, x, compiler="eager", plan_cache=str(tmp_path))
    assert again.plan_cache == "hit" and [n.module for n in again.nodes] == [n.module for n in first.nodes]
    assert {n.input_name for n in again.nodes} >= {"layers.0.attn.q_proj.weight", "head.bias"}


def test_names_that_cannot_be_read_leave_node_names_and_say_so(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    from remat.passes.capture import names

    def unforeseen(*args: object) -> None:
        raise KeyError("nn_module_stack")

    monkeypatch.setattr(names, "node_names", unforeseen)
    with caplog.at_level("WARNING", logger=names.__name__):
        assert names.names_of(torch.fx.Graph()) == {}
    assert "could not read the user's names" in caplog.text
