"""The example notebook is stored without outputs, and the README's command runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "tour.ipynb"
COMMAND = ".venv/bin/jupyter nbconvert --to html --execute"  # as the README gives it
KERNEL = "remat-tour-python"
CELL_TIMEOUT_S = 300


def test_notebook_is_stored_without_outputs() -> None:
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code, "the tour has code"
    assert all(c.outputs == [] and c.execution_count is None for c in code), "clear the outputs before committing"


def kernelspec_here(folder: Path) -> None:
    """A kernelspec that runs the notebook with this interpreter (and so this environment)."""
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))


def test_the_readmes_notebook_command_runs_it(tmp_path: Path) -> None:
    """The README's command, with this interpreter's kernel and the page written to a scratch folder."""
    pytest.importorskip("nbconvert")
    pytest.importorskip("ipykernel")
    readme = " ".join((ROOT / "README.md").read_text().split())  # a command may wrap
    assert f"`{COMMAND} examples/tour.ipynb`" in readme, "the README names the command that runs the notebook"
    kernelspec_here(tmp_path)
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path), "JUPYTER_PLATFORM_DIRS": "1"}
    jupyter = Path(sys.executable).parent / "jupyter"
    done = subprocess.run([str(jupyter), *COMMAND.split()[1:], str(NOTEBOOK), "--output-dir", str(tmp_path),
                           f"--ExecutePreprocessor.kernel_name={KERNEL}",
                           f"--ExecutePreprocessor.timeout={CELL_TIMEOUT_S}"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    page = (tmp_path / "tour.html").read_text()
    assert "remat report" in page and "remat budget sweep" in page
    assert page.count("data:image/png;base64") >= 3, "the report's, the sweep's and the fit's figures"
    assert "measured peak" in page and "largest batch that fits" in page
