"""The benchmark harnesses run end to end on the CPU (a check of the harness, not of speed)."""

from __future__ import annotations

import json
import pathlib

import pytest

from bench import __main__ as bench_main
from bench import budgets, pareto, peers, scaling


def test_budgets_smoke_writes_results(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a harness check: one layer and two budgets exercise every path the three budgets of a real run do
    monkeypatch.setattr(budgets, "FRACTIONS", (0.5, 0.2))
    budgets.main(["--device", "cpu", "--smoke", "--steps", "2", "--set", "layers=1", "--out", str(tmp_path)])
    [result] = tmp_path.glob("*-cpu-smoke-gpt-budgets.json")
    rows = json.loads(result.read_text())["rows"]
    assert rows[0]["policy"] == "torch.compile default" and len(rows) == 2 + len(budgets.FRACTIONS)
    assert rows[1]["policy"] == "remat, no budget" and rows[1]["compiled_peak_bytes"] > 0
    for row in rows[2:]:  # whether each fits is the benchmark's finding, recorded per row
        assert row["compiled_peak_bytes"] <= row["budget_bytes"] and isinstance(row["within_budget"], bool)
    assert all(row["peak_bytes"] > 0 and row["step_ms"] > 0 for row in rows)


def test_scaling_smoke_writes_results(tmp_path: pathlib.Path) -> None:
    # planned op by op: the harness and the solver's figures need no Inductor compile
    scaling.main(["--layers", "1", "--compiler", "eager", "--out", str(tmp_path)])
    [result] = tmp_path.glob("*-cpu-scaling.json")
    [row] = json.loads(result.read_text())["rows"]
    assert row["layers"] == 1 and row["candidates"] > 0 and row["solver_status"] in ("optimal", "feasible")
    assert list(tmp_path.glob("*-cpu-scaling.png")) and list(tmp_path.glob("*-cpu-scaling.md"))


def test_bench_smoke_every_peer_beside_remat(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pareto, "SWEEP", (0.02, 0.5))
    # torch's budget peers at 0.8 and 0.2 run the same code as at 0.5; 0.0 is a case of its own in torch
    monkeypatch.setattr(peers, "PEERS", [p for p in peers.PEERS if p.budget not in (0.8, 0.2)])
    bench_main.main(["--device", "cpu", "--smoke", "--models", "gpt", "--steps", "1", "--set", "layers=1",
                     "--out", str(tmp_path)])
    [result] = tmp_path.glob("*-cpu-smoke-gpt.json")
    data = json.loads(result.read_text())
    assert data["meta"]["command"].startswith("python -m bench --device cpu --smoke")
    assert data["meta"]["torch"] and data["meta"]["date"] and data["meta"]["device"] == "cpu"
    rows = {r["policy"]: r for r in data["rows"]}
    for peer in peers.PEERS:  # a row for every peer, measured
        row = rows[peer.name]
        assert row["status"] == "ok" and row["peak_bytes"] > 0 and row["step_ms"] > 0, row
        assert rows[f"remat at {peer.name} peak"]["budget_bytes"] == row["peak_bytes"]
    free = rows["remat (no budget)"]
    assert free["status"] == "ok" and free["budget_bytes"] is None and free["predicted_peak_bytes"] > 0
    remat_rows = [r for r in data["rows"] if r["kind"].startswith("remat") and r["budget_bytes"]]
    assert len(remat_rows) == len(peers.PEERS) + 2
    for row in remat_rows:  # infeasible is a finding; a measured row must fit its budget
        assert row["status"] in ("ok", "infeasible"), row
        if row["status"] == "ok":
            assert row["within_budget"] and 0 < row["peak_bytes"] <= row["budget_bytes"], row
            assert row["predicted_peak_bytes"] <= row["budget_bytes"]
        else:
            assert row["min_feasible_bytes"] > row["budget_bytes"]
    assert [r["kind"] for r in data["rows"]].count("remat-sweep") == 2
    assert {t["target"] for t in data["targets"]} >= {"measured peak never over budget",
                                                        "lower budget never higher measured peak"}
    assert data["summary"].startswith("gpt: remat time / peer time")
    for suffix in ("md", "png"):
        assert (tmp_path / result.name.replace(".json", f".{suffix}")).stat().st_size > 0
    assert data["summary"] in next(tmp_path.glob("*-cpu-smoke-summary.md")).read_text()
