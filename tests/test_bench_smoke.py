"""The benchmark harnesses run end to end on the CPU (a check of the harness, not of speed)."""

from __future__ import annotations

import json
import pathlib

from bench import budgets, scaling


def test_budgets_smoke_writes_results(tmp_path: pathlib.Path) -> None:
    budgets.main(["--device", "cpu", "--smoke", "--steps", "2", "--out", str(tmp_path)])
    [result] = tmp_path.glob("*-cpu-smoke-gpt-budgets.json")
    rows = json.loads(result.read_text())["rows"]
    assert rows[0]["policy"] == "torch.compile default" and len(rows) == 1 + len(budgets.FRACTIONS)
    for row in rows[1:]:  # whether each fits is the benchmark's finding, recorded per row
        assert row["predicted_peak_bytes"] <= row["budget_bytes"] and isinstance(row["within_budget"], bool)
        assert row["peak_bytes"] > 0 and row["step_ms"] > 0


def test_scaling_smoke_writes_results(tmp_path: pathlib.Path) -> None:
    scaling.main(["--layers", "1", "--out", str(tmp_path)])
    [result] = tmp_path.glob("*-cpu-scaling.json")
    [row] = json.loads(result.read_text())["rows"]
    assert row["layers"] == 1 and row["candidates"] > 0 and row["solver_status"] in ("optimal", "feasible")
