"""The rank's peak a plan is judged by (passes/peaks.py), on a hand-built problem with worked answers."""

from __future__ import annotations

import dataclasses
import types

from remat.passes.peaks import compiled_rank_peak, model_peak, with_timeline
from remat.passes.program.known_programs import ProgramAccount
from remat.solvers.baselines import store_all
from tests.solvers.conftest import branch_problem


def plan_of(problem, *, scope=None) -> types.SimpleNamespace:
    return types.SimpleNamespace(problem=problem, solution=store_all(problem), scope=scope)


def test_the_model_peak_is_the_simulated_one() -> None:
    problem = branch_problem()  # store-all peaks at 420 B (its docstring)
    assert model_peak(problem, store_all(problem)) == 420 == store_all(problem).peak_bytes


def test_the_compiled_peak_is_the_programs_or_its_handoff_with_the_eager_code_and_the_memory_outside() -> None:
    problem = branch_problem()
    program = ProgramAccount(peak_bytes=400, handoff_bytes=150, peaks=(300, 400, 50))
    assert compiled_rank_peak(plan_of(problem), program, eager=0) == 400  # the program's own peak
    assert compiled_rank_peak(plan_of(problem), program, eager=300) == 450  # the hand-off plus the eager code
    # outputs the eager code frees are not held through the backward: its peak is 400 - 50
    assert compiled_rank_peak(plan_of(problem), program, eager=0, freed=80) == 350
    outside = dataclasses.replace(problem, outside=(("state the graph does not read", 1000),))
    assert compiled_rank_peak(plan_of(outside), program, eager=0) == 1400  # counted at every step


def test_more_memory_around_the_same_decisions_raises_the_model_peak_by_as_much() -> None:
    problem = branch_problem()
    outside = dataclasses.replace(problem, outside=(("the eager window", 64),))
    again = with_timeline(outside, store_all(problem))
    assert again.peak_bytes == 420 + 64 and again.saved == store_all(problem).saved
