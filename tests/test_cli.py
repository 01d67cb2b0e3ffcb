"""The ``remat`` command: each subcommand runs; errors are one clear line."""

from __future__ import annotations

import doctest
import inspect
import json
import re
import subprocess
import sys

import pytest

import remat
from remat import cli, demo, options
from remat.options import Options, given


def test_plan_prints_a_summary(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "gpt", "--compiler", "eager"]) == 0
    assert "predicted peak" in capsys.readouterr().out


def test_plan_timings_say_where_compile_time_went(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "gpt", "--layers", "1", "--timings"]) == 0  # under Inductor: every phase
    table = capsys.readouterr().out.split("phase", 1)[1].splitlines()[1:]
    seconds = {line.split()[0]: float(line.split()[1]) for line in table if line.strip()}
    assert list(seconds) == ["capture", "profile", "solve", "inductor", "total"]
    # Each printed figure is rounded to 0.01 s, so the printed total may differ from the sum of
    # the printed phases by up to 5 x 0.005 s.
    assert all(s > 0 for s in seconds.values()) and seconds["total"] == pytest.approx(
        sum(s for phase, s in seconds.items() if phase != "total"), abs=0.026)


def test_plan_json_is_the_report(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "mlp-dropout", "--compiler", "eager", "--json", "--set", "width=32"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"]


def test_errors_are_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "gpt", "--compiler", "eager", "--budget-gb", "1e-9"]) == 2
    assert cli.main(["plan", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("remat: budget") and "known" in err[1]
    # in the command's terms: the flag and the budget to pass it, not the API's keyword
    assert re.search(r"Rerun with --budget-gb \d[\d.e-]* or more", err[0]) and "budget_gb" not in err[0]


def test_help_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "remat.cli", "plan", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--budget-gb" in out.stdout


FACTORY = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 1))

    def forward(self, x):
        return self.body(x).pow(2).mean()


def make():
    return Net(), (torch.randn(64, 32),)


def wrong():
    return "a model"


def broken():
    raise RuntimeError("no GPU here")
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A package of the user's own in the current folder, as ``remat plan --module`` finds it."""
    (tmp_path / "cli_user_models.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "cli_user_models", raising=False)
    return tmp_path


def test_plan_a_model_of_ones_own(user_package, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan", "--module", "cli_user_models:make", "--compiler", "eager", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any(n["category"] == "matmul" for n in report["nodes"])


@pytest.mark.parametrize(("spec", "message"), [
    ("cli_user_models", "--module takes pkg.module:factory, got 'cli_user_models'"),
    ("no_such_pkg.models:make", "cannot import 'no_such_pkg.models': No module named 'no_such_pkg'"),
    ("cli_user_models:missing", "module 'cli_user_models' has no callable 'missing'"),
    ("cli_user_models:wrong", "cli_user_models:wrong() must return (model, inputs), not str"),
    ("cli_user_models:broken", "cli_user_models:broken() raised RuntimeError: no GPU here"),
])
def test_module_errors_are_one_line(user_package, capsys, spec: str,  # type: ignore[no-untyped-def]
                                    message: str) -> None:
    assert cli.main(["plan", "--module", spec]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"remat: {message}\n" and not captured.out


def test_model_and_module_are_one_or_the_other(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["plan"]) == 2
    assert cli.main(["plan", "gpt", "--module", "a:b"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "name a built-in model" in err[0] and "not both" in err[1]


def test_sweep_writes_table_and_plot(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "frontier"
    assert cli.main(["sweep", "gpt", "--points", "3", "--compiler", "eager", "--out", str(out)]) == 0
    assert "| budget |" in capsys.readouterr().out
    data = json.loads((out / "sweep.json").read_text())
    assert len(data["rows"]) == 3 and all(r["feasible"] for r in data["rows"])
    assert (out / "sweep.md").read_text().count("| yes |") == 3
    assert (out / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_demo_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["demo", "--device", "cpu", "--layers", "1", "--compiler", "eager", "--fraction", "0.3",
                     "--plan-cache", "off"]) == 0
    assert "measured peak" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["plan", "sweep", "demo"])
def test_each_command_has_help(command: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0 and f"usage: remat {command}" in capsys.readouterr().out


def test_usage_errors_are_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as done:
        cli.main(["sweep", "gpt", "--budgets-gb", "1,x"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "--budgets-gb" in err


@pytest.mark.parametrize("command", [[], ["plan"], ["sweep"], ["demo"]], ids=lambda c: " ".join(c) or "remat")
def test_help_imports_no_torch(command: list[str]) -> None:
    """``remat --help`` is quick because nothing imports torch until a subcommand runs."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "remat.cli", *command, "--help"],
                          capture_output=True, text=True)
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert done.returncode == 0 and "usage: remat" in done.stdout and "remat.cli" in imported
    assert not [name for name in imported if name.split(".")[0] == "torch"]


@pytest.mark.parametrize(("command", "api", "not_taken"), [("plan", remat.plan, ()), ("sweep", remat.sweep, ()),
                                                           ("demo", remat.compile, ("budget_gb",))])
def test_each_command_takes_the_options_its_api_takes(command: str, api, not_taken: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    """One list (remat.options.Options) makes the flags: a new option reaches every command."""
    taken = [name for name in inspect.signature(api).parameters if name in Options.names() and name not in not_taken]
    defaults = Options().kwargs()
    assert given(cli.parser().parse_args([command])) == {name: defaults[name] for name in taken}


def test_remat_demo_takes_what_python_m_remat_demo_takes() -> None:
    argv = ["--fraction", "0.3", "--device", "cpu", "--layers", "2", "--compiler", "eager", "--plan-cache", "off",
            "--json", "--timings", "--time-limit-s", "5"]
    own = vars(demo.parse_args(argv))
    through_cli = vars(cli.parser().parse_args(["demo", *argv]))
    assert own == {key: through_cli[key] for key in own}
    assert own["fraction"] == 0.3 and own["option_plan_cache"] is False and own["option_time_limit_s"] == 5.0


def test_sizes_have_one_metavar(capsys) -> None:  # type: ignore[no-untyped-def]
    metavars = {}
    for command in ("plan", "sweep", "demo"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        metavars.update(re.findall(r"(--[\w-]+-gb) ([A-Z,.]+)", capsys.readouterr().out))
    assert metavars == {"--budget-gb": "GIB", "--budgets-gb": "GIB,GIB,..."}


@pytest.mark.parametrize(("argv", "message"), [
    (["plan", "mlp-dropout", "--headroom", "2"], "--headroom must be a fraction in [0, 1), not 2.0"),
    (["sweep", "mlp-dropout", "--budgets-gb", "-1"], "--budgets-gb must be positive, got -1.0"),
    (["plan", "mlp-dropout", "--policy", "nope"], "--policy must be a remat.policies.Policy or one of"),
])
def test_option_errors_name_the_flag(argv: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main([*argv, "--compiler", "eager"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"remat: {message}") and captured.err.count("\n") == 1 and not captured.out


def test_sweep_json_and_timings(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["sweep", "mlp-dropout", "--set", "width=32", "--compiler", "eager", "--points", "2", "--json",
                     "--timings"]) == 0
    captured = capsys.readouterr()
    frontier = json.loads(captured.out)  # stdout is the frontier alone; the timings go to stderr
    assert frontier["rows"] and all(row["feasible"] for row in frontier["rows"])
    seconds = {line.split()[0]: float(line.split()[1]) for line in captured.err.splitlines()[1:]}
    assert list(seconds) == ["solve", "other", "total"] and seconds["solve"] > 0 and seconds["other"] > 0


@pytest.mark.parametrize("module", [cli, options])
def test_docstring_examples(module) -> None:  # type: ignore[no-untyped-def]
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
