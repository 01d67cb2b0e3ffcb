"""The ``remat`` command: each subcommand runs; errors are one clear line."""

from __future__ import annotations

import json
import subprocess
import sys

from remat import cli


def test_plan_prints_a_summary(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "gpt", "--compiler", "eager"]) == 0
    assert "predicted peak" in capsys.readouterr().out


def test_plan_json_is_the_report(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "mlp-dropout", "--compiler", "eager", "--json", "--set", "width=32"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"]


def test_errors_are_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "gpt", "--compiler", "eager", "--budget-gb", "1e-9"]) == 2
    assert cli.main(["plan", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("remat: budget") and "known" in err[1]


def test_help_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "remat.cli", "plan", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--budget-gb" in out.stdout
