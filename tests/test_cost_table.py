"""The measured op cost table: a second process measures nothing measured before; bad files are ignored loudly."""

from __future__ import annotations

import json
import logging
import pathlib

import pytest
import torch

from remat.passes.cache import cost_table

from remat.passes.costs import profile, timing
from remat.passes.cache.cost_table import CostTable
from remat.passes.capture.values import describe_value
from tests.conftest import build
from tests.passes.helpers import capture

CPU = torch.device("cpu")


def _joint_graph() -> torch.fx.Graph:
    """A small model's joint graph, as remat receives it."""
    model, inputs = build("mlp-dropout", batch=8)
    torch._dynamo.reset()
    return capture(model, *inputs).joint


def _counting_measurements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    measured: list[str] = []
    real = profile.measure_op

    def counted(node: torch.fx.Node, *args: object) -> tuple[float, float, int]:
        measured.append(node.name)
        return real(node, *args)

    monkeypatch.setattr(profile, "measure_op", counted)
    return measured


def test_a_second_profile_with_the_table_measures_nothing(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _joint_graph()
    measured = _counting_measurements(monkeypatch)
    first = profile.profile_graph(graph, cache=profile.TimingCache(), cost_folder=tmp_path)
    assert measured and len(list(tmp_path.glob("*.json"))) == 1
    measured.clear()
    again = profile.profile_graph(graph, cache=profile.TimingCache(), cost_folder=tmp_path)  # a new process's cache
    assert measured == [] and again == first


def test_the_table_is_plain_json_keyed_by_device_and_torch(tmp_path: pathlib.Path) -> None:
    table = CostTable(tmp_path, CPU)
    key = ("aten.mm.default", "((T, (4, 4)),)", "{}")
    assert table.store({cost_table.signature(key): (1.5e-5, 128.0, 0, True),
                        cost_table.signature(("aten.relu",)): (1e-6, 0.0, 0, False)})  # analytic: not stored
    data = json.loads(table.path.read_text())
    assert data["key"] == {"format": cost_table.FORMAT, "device": cost_table.device_key(CPU)["device"],
                           "torch": torch.__version__}
    assert list(data["entries"]) == [json.dumps(list(key))]
    assert CostTable(tmp_path, CPU).load() == {cost_table.signature(key): (1.5e-5, 128.0, 0, True)}


def _rewrite(path: pathlib.Path, change: object) -> None:
    data = json.loads(path.read_text())
    change(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage, warning", [
    (lambda path: path.write_text("{not json"), "ignoring the op cost table"),
    (lambda path: _rewrite(path, lambda d: d["entries"].update({"x": [1.0, 0.0, 0, True]})), "checksum"),
    (lambda path: _rewrite(path, lambda d: (d["key"].update(torch="0.0"), d.update(
        checksum=cost_table._digest({k: v for k, v in d.items() if k != "checksum"})))), "another device"),
], ids=["corrupt", "edited", "foreign"])
def test_bad_files_are_ignored_with_a_warning(tmp_path: pathlib.Path, damage: object, warning: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    table = CostTable(tmp_path, CPU)
    table.store({cost_table.signature(("op",)): (1.0, 0.0, 0, True)})
    damage(table.path)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, logger="remat.passes.cache.cost_table"):
        assert CostTable(tmp_path, CPU).load() == {}
    assert warning in caplog.text
    assert CostTable(tmp_path, CPU).store({cost_table.signature(("op",)): (2.0, 0.0, 0, True)})  # replaced whole
    assert CostTable(tmp_path, CPU).load() == {cost_table.signature(("op",)): (2.0, 0.0, 0, True)}


def test_where_the_table_lives(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REMAT_COST_CACHE", raising=False)
    assert cost_table.cost_dir(tmp_path) == tmp_path / "costs"
    assert cost_table.cost_dir(None) is None  # the plan cache off: the table too
    monkeypatch.setenv("REMAT_COST_CACHE", str(tmp_path / "elsewhere"))
    assert cost_table.cost_dir(None) == tmp_path / "elsewhere"
    monkeypatch.setenv("REMAT_COST_CACHE", "off")
    assert cost_table.cost_dir(tmp_path) is None


def test_an_unwritable_folder_warns(tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="remat.passes.cache.cost_table"):
        assert not CostTable(blocker / "costs", CPU).store({cost_table.signature(("op",)): (1.0, 0.0, 0, True)})
    assert "could not write the op cost table" in caplog.text


def test_times_are_on_a_grid() -> None:
    step = timing.QUANTUM ** -60  # a point of the grid
    assert timing.quantize_seconds(step * 1.05) == timing.quantize_seconds(step / 1.05) == pytest.approx(step)
    assert timing.quantize_seconds(step * timing.QUANTUM) > timing.quantize_seconds(step)
    assert timing.quantize_seconds(0.0) == 0.0


def test_an_analytic_profile_reads_no_cost_measured_before_in_the_process() -> None:
    """One process-wide timing cache serves both modes: an analytic profile of a graph costs
    the same before and after the graph was measured (a plan must not depend on what ran before)."""
    graph = _joint_graph()
    shared = profile.TimingCache()
    analytic = profile.profile_graph(graph, mode="analytic", cache=profile.TimingCache())
    measured = profile.profile_graph(graph, mode="measure", cache=shared)
    assert any(cost.measured for cost in measured.values())
    assert profile.profile_graph(graph, mode="analytic", cache=shared) == analytic


def test_a_symbolic_size_is_keyed_by_the_size_it_stands_for() -> None:
    """Graphs captured with a symbolic size at two example sizes: their ops' cost keys, and the
    inputs' description the program and plan caches key on, differ (by its name, ``s0``, they
    were the same, and the second size read costs and program accounts made at the first)."""
    seen: list[tuple[tuple, object]] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        for node in gm.graph.nodes:  # (dynamo's graph; the joint graphs remat profiles hold "val")
            node.meta["val"] = node.meta.get("example_value")
        mm = next(n for n in gm.graph.nodes if n.op == "call_function")
        seen.append((profile.cache_key(mm), describe_value(list(example_inputs))))
        return gm

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, x.transpose(0, 1))

    compiled = torch.compile(f, backend=keep, dynamic=True)
    compiled(torch.ones(3, 4)), compiled(torch.ones(5, 4))
    assert len(seen) == 1  # one symbolic graph: the second size ran it without a capture
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=keep, dynamic=True)
    compiled(torch.ones(5, 4))
    (first_key, first_inputs), (second_key, second_inputs) = seen
    assert "5" in repr(second_key) and "3" in repr(first_key) and first_key != second_key
    assert first_inputs != second_inputs
