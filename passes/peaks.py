"""The peaks remat names, and the rank's peak each plan is judged by.

Four peaks of one graph's step, from the plan to the run:

- **the model's** (``plan.solution.peak_bytes``): the solvers' simulation of the joint graph's steps
  under the plan (``remat.solvers.simulate.timeline``), what the integer program bounds; op by op it
  is the step's peak exactly, under Inductor a proposal (:func:`model_peak`);
- **the realized graphs'** (``plan.realized_peak_bytes``): the forward and backward graphs torch built
  from the plan, run op by op (``passes/modeling/memory.realized_peak``), the self-check that the
  partition did what the plan says;
- **the compiled program's** (``plan.compiled_peak_bytes``): the wrapper Inductor generated, accounted
  for line by line (``passes/program/inductor_account.step_account``), with the memory the budget
  counts outside the graph (:func:`compiled_rank_peak`, and :func:`rank_peak_with` once the eager
  parts of the step are measured); under Inductor the budget is checked against this one;
- **the measured** peak of a step that ran (``passes/program/measure.step_peak``: a profiler session
  of remat's own, the allocator's statistics left alone; the eager window between a graph's forward
  and its backward likewise, ``passes/scope/eager_window``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from remat.solvers.model import outside_with_copies
from remat.solvers.simulate import timeline


def model_peak(problem: Any, solution: Any) -> int:
    """The model's peak of ``problem`` under ``solution``'s decisions."""
    return max(timeline(problem, solution.saved, solution.recomputed), default=0)


def compiled_rank_peak(plan: Any, program: Any, eager: int, freed: int | None = None,
                       saved: frozenset | None = None) -> int:
    """The rank's peak under ``plan``'s graph and scope with ``program``, ``eager`` bytes of eager code
    between its forward and backward, and ``saved`` kept (the plan's own by default). Outputs the
    eager code was measured to free (a loss outside the model drops the logits) are not held through
    the backward, which the program's own account does."""
    extra = outside_with_copies(plan.problem, plan.solution.saved if saved is None else saved)
    if freed is None:
        freed = plan.scope.eager_freed_bytes if plan.scope is not None else 0
    peak = program.peak_bytes
    if freed and program.peaks is not None:
        forward, backward, outputs = program.peaks
        peak = max(forward, backward - min(freed, outputs))
    return max(peak, program.handoff_bytes + eager) + extra


def rank_peak_with(plan: Any, eager: Any) -> int:
    """The rank's peak under ``plan`` with ``eager`` parts (``passes/scope/eager_window.EagerParts``)
    between the graph's forward and its backward: by its compiled program where there is one
    (Inductor), else by the model."""
    scope = plan.scope.with_eager(eager)
    if plan.compiled_peak_bytes is None:
        return model_peak(scope.applied(plan.problem), plan.solution)
    grown = outside_grown(plan, scope)
    handoff = max(0, eager.peak - eager.after)  # (what the window leaves is counted in grown, at every row)
    program = plan.program
    if program is None:  # a program whose forward's end was not read: as if at its peak
        return plan.compiled_peak_bytes + handoff + grown
    # (a reservation the program was compiled with is replaced by the eager parts)
    read = program if program.peak_bytes is not None else replace(program, peak_bytes=0)
    at_handoff = compiled_rank_peak(plan, read, handoff, eager.freed) + grown
    # without the program's own peak, the one accepted stands; the hand-off may now be higher
    return at_handoff if program.peak_bytes is not None else max(plan.compiled_peak_bytes + grown, at_handoff)


def outside_grown(plan: Any, scope: Any) -> int:
    """How much more memory outside the graph ``scope`` counts than the plan's own scope did."""
    if (scope.outside_bytes, scope.copies) == (plan.scope.outside_bytes, plan.scope.copies):
        return 0
    saved = plan.solution.saved
    return (outside_with_copies(scope.applied(plan.problem), saved)
            - outside_with_copies(plan.scope.applied(plan.problem), saved))


def with_timeline(problem: Any, solution: Any) -> Any:
    """``solution`` with its model peak and timeline read again from ``problem`` (the same decisions
    with more memory counted around them)."""
    line = timeline(problem, solution.saved, solution.recomputed)
    return replace(solution, peak_bytes=max(line, default=0), timeline=line)
