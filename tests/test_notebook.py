"""The example notebook is stored without outputs, and it runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "tour.ipynb"
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


def test_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    kernelspec_here(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("remat report" in h for h in html) and any("remat budget sweep" in h for h in html)
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2, "the report's and the sweep's figures"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "measured peak" in text
