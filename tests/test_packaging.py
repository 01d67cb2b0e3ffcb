"""What a user calls runs from a regular install, and the test process loads each module once.

The install is ``pip install --target`` of a clean copy of the checkout (a stale
``build/`` folder in the checkout could otherwise hand pip files that are gone),
run from an empty folder with ``python -P``, so neither the checkout nor the
working folder is on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bench.__main__  # noqa: F401  (the helpers the suite loads besides remat)
import remat  # noqa: F401
import tests.conftest  # noqa: F401
import tests.random_models  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
NOT_PACKAGED = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "bench", "tests", "examples")
SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []  # before 3.11 the empty working folder stands in
RUN_LIMIT_S = 300
WHERE = """
import importlib.metadata, importlib.util, sys
import remat, remat.cli, remat.demo, remat.passes, remat.solvers, remat.zoo
for module in (remat, remat.cli, remat.demo, remat.passes, remat.solvers, remat.zoo):
    print("file", module.__file__)
for name in ("bench", "solvers", "passes"):
    print("top-level", name, importlib.util.find_spec(name) is not None)
(script,) = importlib.metadata.entry_points(group="console_scripts", name="remat")
print("script", script.value, flush=True)
sys.exit(script.load()(sys.argv[1:]))  # what the installed remat command runs
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(site, work): remat installed into ``site`` as ``pip install remat`` would, and an empty folder."""
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed")
    tmp = tmp_path_factory.mktemp("packaging")
    source, site, work = tmp / "source", tmp / "site", tmp / "work"
    shutil.copytree(ROOT, source, ignore=NOT_PACKAGED)
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile",
           "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return site, work


def run_installed(installed: tuple[Path, Path], *args: str) -> str:
    """stdout of ``python -P ARGS`` run in the empty folder with only the install added to ``sys.path``."""
    site, work = installed
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, *SAFE_PATH, *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_installed_remat_command_plans_a_built_in_model(installed: tuple[Path, Path]) -> None:
    """The modules come from the install, bench/ is out of reach, and ``remat plan gpt`` runs."""
    site = installed[0].resolve()
    out = run_installed(installed, "-c", WHERE, "plan", "gpt", "--layers", "1", "--compiler", "eager")
    lines = out.splitlines()
    files = [Path(line.split(" ", 1)[1]).resolve() for line in lines if line.startswith("file ")]
    assert len(files) == 6 and all(f.is_relative_to(site) for f in files), files
    assert [line for line in lines if line.startswith("top-level")] == [
        "top-level bench False", "top-level solvers False", "top-level passes False"]
    assert "script remat.cli:main" in lines and "predicted peak" in out


def test_installed_demo(installed: tuple[Path, Path]) -> None:
    out = run_installed(installed, "-m", "remat.demo", "--device", "cpu", "--layers", "1", "--compiler", "eager")
    assert "GPT-style model on cpu" in out and "measured peak" in out


def test_solvers_and_passes_load_once() -> None:
    """remat.solvers and remat.passes come from the top-level solvers/ and passes/ folders; loaded
    under those names too they would be second copies (two solver registries, two Status enums)."""
    top_level = [name for name in sys.modules if name.split(".")[0] in ("solvers", "passes")]
    assert not top_level, f"loaded as top-level modules besides remat.solvers and remat.passes: {top_level}"


def test_no_file_loads_as_two_modules() -> None:
    """E.g. tests/conftest.py as both conftest and tests.conftest (tests/ is a package so it cannot be)."""
    modules_of: dict[str, dict[int, str]] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if file.endswith(".py") and name != "__main__":
            modules_of.setdefault(os.path.realpath(file), {})[id(module)] = name
    twice = {file: sorted(names.values()) for file, names in modules_of.items() if len(names) > 1}
    assert not twice, twice
