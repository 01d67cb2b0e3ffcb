"""The same model, inputs and budget give the same plan: within a process, and across processes."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import remat
from tests.conftest import budget_between, build, planned

REPO = pathlib.Path(__file__).resolve().parents[1]
LAYERS = 1  # one block has every tie the planner breaks; each more only adds compile time

PLAN_IN_A_NEW_PROCESS = """
import json, sys, torch
import remat
from tests.conftest import build
torch.manual_seed(0)
model, inputs = build("llama", layers=int(sys.argv[5]))
cache = False if sys.argv[4] == "off" else sys.argv[4]
r = remat.plan(model, *inputs, budget_gb=float(sys.argv[1]), compiler=sys.argv[2], profile=sys.argv[3],
               plan_cache=cache)
print(json.dumps({"saved": sorted(r.saved), "recomputed": sorted(r.recomputed), "cache": r.plan_cache}))
"""


def _plans_in_new_processes(count: int, budget: float, compiler: str, profile: str, cache: str,
                            env: dict[str, str] | None = None) -> list[dict]:
    """Plan in ``count`` fresh processes at once (they share nothing, so they may overlap)."""
    argv = [sys.executable, "-c", PLAN_IN_A_NEW_PROCESS, str(budget), compiler, profile, cache, str(LAYERS)]
    running = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
               for _ in range(count)]
    plans = []
    for process in running:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
        plans.append(json.loads(out.strip().splitlines()[-1]))
    return plans


def _plan_in_new_process(budget: float, compiler: str, profile: str, cache: str,
                         env: dict[str, str] | None = None) -> dict:
    return _plans_in_new_processes(1, budget, compiler, profile, cache, env)[0]


def _binding_budget(compiler: str) -> float:
    """A budget 40 % of the way from the smallest feasible budget to store-all, from the report
    other tests of this session share (measured costs; the analytic test plans at it too, rather
    than compiling an analytic plan of its own for the budget alone). Each test asserts that its
    plans recompute: the budget binds."""
    return budget_between(planned("llama", compiler, layers=LAYERS), 0.4)


def test_the_same_plan_twice_in_one_process() -> None:
    budget = _binding_budget("inductor")
    model, inputs = build("llama", layers=LAYERS)
    first = remat.plan(model, *inputs, budget_gb=budget)
    second = remat.plan(model, *inputs, budget_gb=budget)
    assert first.recomputed and (first.saved, first.recomputed) == (second.saved, second.recomputed)


def test_analytic_plans_agree_across_processes_without_a_cache() -> None:
    budget = _binding_budget("inductor")
    runs = _plans_in_new_processes(2, budget, "inductor", "analytic", "off")
    assert runs[0]["recomputed"] and runs[0] == runs[1]


def test_measured_plans_agree_across_processes_through_the_plan_cache(tmp_path: pathlib.Path) -> None:
    budget = _binding_budget("eager")
    first = _plan_in_new_process(budget, "eager", "measure", str(tmp_path))
    second = _plan_in_new_process(budget, "eager", "measure", str(tmp_path))
    assert (first["cache"], second["cache"]) == ("stored", "hit")
    assert first["recomputed"] and (first["saved"], first["recomputed"]) == (second["saved"], second["recomputed"])


def test_measured_plans_agree_across_processes_through_the_cost_table(tmp_path: pathlib.Path) -> None:
    """The plan cache off, the op cost table on: the second process times no op, it reads
    the first one's times, so it makes the same plan (a plan depends only on its costs)."""
    budget = _binding_budget("eager")
    env = {"REMAT_COST_CACHE": str(tmp_path)}
    first = _plan_in_new_process(budget, "eager", "measure", "off", env)
    (table,) = tmp_path.glob("*.json")
    written = table.stat().st_mtime_ns
    second = _plan_in_new_process(budget, "eager", "measure", "off", env)
    assert (first["cache"], second["cache"]) == ("", "")
    assert table.stat().st_mtime_ns == written  # nothing new was measured
    assert first["recomputed"] and (first["saved"], first["recomputed"]) == (second["saved"], second["recomputed"])
