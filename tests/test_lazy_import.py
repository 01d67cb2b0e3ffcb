"""``import remat`` imports no torch; each public name is imported when first read.

Each check runs in a fresh interpreter: this one has torch imported already.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import remat

# Put first in a child's code: any import of torch raises, as if it were not installed.
NO_TORCH = '''
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, NoTorch())
'''


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout, or a failure showing its stderr."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_solvers_work_where_torch_cannot_be_imported() -> None:
    out = run_python(NO_TORCH + '''
import remat.solvers
from remat.solvers.testing import Node, build_problem

problem = build_problem(
    inputs=[("x", 10)],
    forward=[Node("a", 100, ("x",), recompute_seconds=5.0), Node("b", 100, ("a",), recompute_seconds=0.1),
             Node("out", 10, ("b",), output=True)],
    backward=[Node("g1", 200), Node("g2", 10, ("b",)), Node("g3", 10, ("a",), grad=True)],
)
plan = remat.solvers.get("greedy").solve(problem, 350)
print(sorted(plan.recomputed), plan.peak_bytes)

import remat
print(remat.__version__, remat.Options(budget_gb=1).budget_bytes)
try:
    remat.plan
except ImportError as exc:
    print("plan needs torch:", exc)
''')
    lines = out.splitlines()
    assert lines[0] == "['b'] 320"
    assert lines[1] == f"{remat.__version__} {2**30}"
    assert lines[2] == "plan needs torch: torch is blocked in this test"


def test_import_remat_imports_no_torch() -> None:
    out = run_python('''
import sys
import remat
print("torch" in sys.modules, sorted(set(remat.__all__) - set(dir(remat))))
remat.BudgetError, remat.Options, remat.Report, remat.budget_bytes  # torch-free names
print("torch" in sys.modules)
''')
    assert out.split() == ["False", "[]", "False"]


def test_public_names_resolve_to_their_definitions() -> None:
    from remat import api, frontier, options, report

    assert (remat.plan, remat.compile, remat.sweep, remat.Frontier) == (api.plan, api.compile, frontier.sweep,
                                                                       frontier.Frontier)
    assert (remat.Options, remat.Report) == (options.Options, report.Report)
    assert set(remat.__all__) <= set(dir(remat))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        remat.nope  # noqa: B018


def test_backend_name_works_after_import_remat() -> None:
    """``backend="remat"`` is dynamo's name for remat's backend once ``import remat`` ran, before
    (through the installed entry point) and after a name that needs torch is read."""
    out = run_python('''
import remat
from torch._dynamo import lookup_backend
from remat.backend import remat_backend
print(lookup_backend("remat") is remat_backend)
remat.compile
print(lookup_backend("remat") is remat_backend)
''')
    assert out.split() == ["True", "True"]
