"""The layers import one way: solvers (torch-free) <- passes (torch, FX) <- remat (user-facing).

Every import statement of every module is read (at module level or inside a function,
``TYPE_CHECKING`` blocks included), so an upward import fails here, not by import order
on some later day.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import remat
import remat.passes
import remat.solvers

PACKAGES = {"remat": Path(remat.__file__).parent, "remat.passes": Path(remat.passes.__file__).parent,
            "remat.solvers": Path(remat.solvers.__file__).parent}
LAYER = {"remat.solvers": 0, "remat.passes": 1, "remat": 2}


def layer_of(module: str) -> str | None:
    """The layer a dotted module name belongs to; None outside remat."""
    for package in ("remat.solvers", "remat.passes", "remat"):
        if module == package or module.startswith(package + "."):
            return package
    return None


def imported(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, a module of ``package``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside the module's own package (or above it)
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
                names = [f"{module}.{a.name}" for a in node.names] if not node.module else [module]
                found += [(node.lineno, n) for n in names]
            else:
                # `from remat import solvers` imports the submodule, not the package's own names
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in PACKAGES]
                found += [(node.lineno, n) for n in subs] if len(subs) == len(node.names) else \
                    [(node.lineno, node.module or "")]
    return found


def modules() -> list[tuple[str, Path]]:
    """(package, path) of every module, those of subpackages (the adapter's) included."""
    return [(".".join((package, *path.parent.relative_to(folder).parts)), path)
            for package, folder in PACKAGES.items() for path in sorted(folder.rglob("*.py"))]


@pytest.mark.parametrize(("package", "path"), modules(), ids=lambda p: p.name if isinstance(p, Path) else p)
def test_no_module_imports_a_layer_above_its_own(package: str, path: Path) -> None:
    upward = []
    for line, module in imported(path, package):
        target = layer_of(module)
        if target is not None and LAYER[target] > LAYER[layer_of(package)]:
            upward.append(f"{path.name}:{line} imports {module}")
    assert not upward, f"{package} must not import a layer above it: {upward}"


@pytest.mark.parametrize("path", sorted(PACKAGES["remat.solvers"].glob("*.py")), ids=lambda p: p.name)
def test_solvers_import_no_torch(path: Path) -> None:
    heavy = [m for _, m in imported(path, "remat.solvers") if m.split(".")[0] in ("torch", "functorch")]
    assert not heavy, f"solvers stay torch-free: {path.name} imports {heavy}"


@pytest.mark.parametrize("name", ["report.py", "report_rows.py"])
def test_report_imports_no_torch(name: str) -> None:
    path = PACKAGES["remat"] / name
    heavy = [m for _, m in imported(path, "remat") if m.split(".")[0] == "torch" or layer_of(m) == "remat.passes"]
    assert not heavy, f"remat/{name} reads plain records only: it imports {heavy}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The walk itself: relative and absolute imports upward are both found."""
    module = tmp_path / "m.py"
    module.write_text("from remat.options import Options\nfrom ..report import Report\nimport torch\n"
                      "from remat import solvers\nfrom remat import __version__\n")
    found = {m for _, m in imported(module, "remat.passes")}
    assert found == {"remat.options", "remat.report", "torch", "remat.solvers", "remat"}
    assert {m: layer_of(m) for m in found}["remat.solvers"] == "remat.solvers"


PRIVATE = ("torch._", "torch.utils._", "functorch")


def private_uses(path: Path, package: str) -> list[str]:
    """Imports of private torch modules, and reads of private attributes (``._schema``,
    ``.node.hint``), anywhere in ``path``."""
    found = [f"{path.name}:{line} imports {m}" for line, m in imported(path, package)
             if m.startswith(PRIVATE) and m not in ("torch.__version__",)]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("_schema", "_dynamo", "_inductor", "_functorch"):
            found.append(f"{path.name}:{node.lineno} reads .{node.attr}")
        if isinstance(node, ast.Attribute) and node.attr == "hint" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "node":
            found.append(f"{path.name}:{node.lineno} reads .node.hint")
    return found


@pytest.mark.parametrize(("package", "path"), [m for m in modules() if "torch_adapter" not in m[1].parts],
                         ids=lambda p: p.name if isinstance(p, Path) else p)
def test_private_torch_apis_are_reached_only_through_the_adapter(package: str, path: Path) -> None:
    assert not private_uses(path, package), "go through remat.passes.torch_adapter"


def test_the_private_use_check_sees_them(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from torch._inductor import config\nimport torch.utils._pytree\n"
                      "x = node.target._schema\ny = size.node.hint\n")
    assert len(private_uses(module, "remat.passes")) == 4
