"""Fit the compiled program to the budget (Inductor).

remat plans with a model of the partitioned graphs run op by op; Inductor
then fuses, reorders and reuses buffers. So under Inductor the plan is only a
proposal: each proposal is compiled, the program Inductor generated is
accounted for line by line (:mod:`.inductor_account`), and while that
program peaks over the planning target the plan is made again, tighter by the
overshoot (or, where that miss says the budget is out of the model's reach, the
smallest-peak plan at once). Below the model's smallest peak the smallest-peak plan is compiled
and judged by its own program, so a budget the model would refuse but the
program fits is accepted, and the smallest feasible budget a
:class:`BudgetError` names is the program's, not the model's. Where the first
plan's program peaks far under its target, one looser plan is tried
(:func:`loosened`): the model over-counted, and a faster plan may fit.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

from remat.solvers.errors import BudgetError, format_bytes
from remat.solvers.plan import budget_error, min_budget_bytes
from remat.solvers.solution import Solution

from . import inductor_account as account
from .. import torch_adapter as adapter
from ..decide.attempt import Attempt, CompileStopped, GraphSetting, choosing
from ..decide.graph_plan import GraphPlan
from .known_programs import KNOWN, ProgramAccount
from ..peaks import compiled_rank_peak
from ..decide.partition import Planner

log = logging.getLogger(__name__)
MAX_TIGHTENED = 3  # plans compiled toward the target before the two fall-backs below
# A program that peaks this far under its target (a fraction of it) left room the model did not
# see: one more plan, asked for that much more, is compiled, and the faster program that fits kept.
LOOSEN_UNDER = 0.05
# ... but only a plan the model predicts faster by this fraction of the step's op time: one more
# compile costs about what the first one's code generation did (7 s, +20 % cold, on the demo GPT),
# and on the bench models the looser plans found saved 0.06-0.2 % of the step, below what measured
# op costs can tell apart.
LOOSEN_GAIN = 0.01
# The fastest plan is compiled as a fall-back only where the model's store-all peak is within this
# fraction above the smallest-peak plan's program (fastest_may_be_lower).
FASTEST_MARGIN = 0.25
SMALLEST = 0  # a target below every plan: the model's smallest-peak plan (with settle_for_lowest)
FASTEST = sys.maxsize  # a target no plan is bound by: the fastest plan
Compile = Callable[..., Callable[..., Any]]
Fitted = tuple[Callable[..., Any], GraphPlan | None]  # the callable to run, and its plan (None: inference graph)


def compile_given(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, setting: GraphSetting,
                  compile_graph: Compile) -> Fitted:
    """Compile ``gm`` with the plan ``setting`` was given (rank 0 fitted it to the budget), once:
    every rank compiles the same program."""
    compiled, plan, _ = compile_once(gm, example_inputs, planner, Attempt(setting), compile_graph)
    return compiled, None if plan is None else plan.revised(compile_attempts=1)


def compile_fitted(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, setting: GraphSetting,
                   compile_graph: Compile) -> Fitted:
    """Compile ``gm`` with a plan whose compiled program fits the planning target.

    Up to ``MAX_TIGHTENED`` plans, each asked for less by the last one's overshoot; then the
    model's smallest-peak plan and the fastest plan, whose programs can peak lower than the
    model thinks. If none fits, :class:`BudgetError` names the lower of those two programs'
    peaks: a budget at which this loop always finds a plan.
    """
    settle = planner.request.budget_bytes is not None  # below the model's reach: its smallest-peak plan
    target: int | None = None
    fallbacks: dict[int, int] = {}  # compiled peaks of the smallest-peak and fastest plans
    spent: Counter[str] = Counter()  # every attempt's timings, the rejected plans' too, summed by phase
    attempt = compiles = 0
    last_peak: int | None = None
    skipped = False  # tightening was cut short: the smallest-peak plan was asked for at once
    while True:
        attempt += 1
        asked = Attempt(setting, target=target, settle_for_lowest=settle)
        compiled, plan, peak = compile_unless_known(gm, example_inputs, planner, asked, compile_graph)
        if plan is None:  # an inference graph (no grad): nothing to plan or fit
            return compiled, None
        compiles += compiled is not None
        plan = plan.revised(compile_attempts=compiles)
        spent.update(plan.timings)
        limit = plan.target
        if compiled is not None and (limit is None or peak <= limit):
            if limit is not None and (target is None or (skipped and target == SMALLEST)):
                # the first plan, or the smallest-peak plan reached at once: far under, try a looser one
                compiled, plan = loosened(gm, example_inputs, planner, setting, compile_graph, (compiled, plan, peak),
                                          spent)
            plan = plan.revised(timings=dict(spent))
            planner.remember_compiled(plan)
            return compiled, plan  # before asking whether the plan is the smallest: that may need a solve
        if target in (SMALLEST, FASTEST):  # asked for: tried (the fastest plan may be the smallest too)
            fallbacks[target] = peak
        if plan.smallest:
            fallbacks[SMALLEST] = peak
        if SMALLEST not in fallbacks:  # compiled before in this process (remat.plan's smallest feasible budget)
            fallbacks.update(smallest_missed(setting, plan, limit))
        if fallbacks.get(SMALLEST, 0) > limit and not fastest_may_be_lower(plan, fallbacks[SMALLEST]):
            raise over_budget(plan, fallbacks[SMALLEST])  # below the smallest feasible budget: nothing fits
        tighten = attempt < MAX_TIGHTENED and not plan.smallest
        if tighten and (out_of_reach(plan, peak, limit) or (last_peak is not None and peak >= last_peak)):
            tighten, skipped = False, True  # out of the model's reach, or tightening made no headway
        last_peak = peak
        if tighten:
            # the model missed by (peak - limit): ask it for that much less than it predicted
            target = min(limit, plan.solution.peak_bytes) - (peak - limit)
        elif SMALLEST not in fallbacks:
            target = SMALLEST
        elif FASTEST not in fallbacks and fastest_may_be_lower(plan, fallbacks[SMALLEST]):
            target = FASTEST
        else:
            raise over_budget(plan, min(fallbacks.values()))
        log.info("remat: compiled program peaks at %s over the target %s; planning again",
                 format_bytes(peak), format_bytes(limit))


def smallest_missed(setting: GraphSetting, plan: GraphPlan, limit: int) -> dict[int, int]:
    """``{SMALLEST: peak}`` where the smallest-peak plan's program is known in this process and
    peaks over ``limit``, else ``{}`` (unknown, or it fits: the loop compiles it when it gets there)."""
    peak = known_peak(setting, plan, plan.lowest())
    return {SMALLEST: peak} if peak is not None and peak > limit else {}


def known_peak(setting: GraphSetting, plan: GraphPlan, solution: Solution) -> int | None:
    """The step's peak under ``plan``'s graph and scope with ``solution``'s program, where that
    program was compiled in this process; else None."""
    program = KNOWN.account(program_of(setting), solution, plan.workspace_by_node)
    if program is None:
        return None
    return compiled_rank_peak(plan, program, plan.problem.handoff_bytes, saved=solution.saved)


def program_of(setting: GraphSetting) -> str:
    """The setting's program identity, which the backend reads for every graph it compiles with
    Inductor: without it, programs of different graphs would share accounts."""
    if not setting.program:
        raise RuntimeError("remat compiled a graph with Inductor without its program identity "
                           "(GraphSetting.program); please report this")
    return setting.program


def fastest_may_be_lower(plan: GraphPlan, smallest_peak: int) -> bool:
    """Whether the fastest plan's program could peak under the smallest-peak plan's program
    (``smallest_peak``), so that compiling it can lower the smallest feasible budget: not where
    the model puts keeping everything more than ``FASTEST_MARGIN`` above that program (the fastest
    program would have to come in that far under the model; the largest such miss the tests record
    is the dropout MLP's 14 %; on the tiny GPT and Llama-style models of the refusal test the
    fastest plan's program peaked 23 % and 31 % above the smallest's). Decided from the
    same two figures wherever the smallest feasible budget is computed, so the loop that fits a
    budget and the figure a report names always agree."""
    return plan.store_all.peak_bytes <= (1 + FASTEST_MARGIN) * smallest_peak


def compile_unless_known(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, attempt: Attempt,
                         compile_graph: Compile, *, fits_too: bool = True) -> tuple[Callable[..., Any] | None,
                                                                                     GraphPlan | None, int]:
    """:func:`compile_once`, except where the plan made is one whose program this process compiled
    already (``passes/program/known_programs.py``) and that program misses the plan's target (any known
    program, with ``fits_too`` off): then no compile, None for the callable, and that program's
    peak (the plan is not kept)."""
    def wanted(plan: GraphPlan) -> bool:
        peak = known_peak(attempt.setting, plan, plan.solution)
        return peak is None or (fits_too and (plan.target is None or peak <= plan.target))

    attempt.wanted = wanted
    try:
        return compile_once(gm, example_inputs, planner, attempt, compile_graph)
    except CompileStopped:
        if attempt.stopped != "unwanted":
            raise
        return None, attempt.plan, known_peak(attempt.setting, attempt.plan, attempt.plan.solution)


def out_of_reach(plan: GraphPlan, peak: int, limit: int) -> bool:
    """Whether the smallest-peak plan's program would miss ``limit`` too, judged by this plan's
    miss: the model's error here (program minus model) added to the model's smallest peak.
    Tightening step by step would then compile plans that cannot fit before reaching it (T5 was
    refused after five compiles); its own program settles the budget in one, and where it fits
    after all, :func:`loosened` gets one faster plan from it."""
    return plan.lowest().peak_bytes + (peak - plan.solution.peak_bytes) > limit


def loosened(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, setting: GraphSetting,
             compile_graph: Compile, accepted: tuple[Callable[..., Any], GraphPlan, int],
             spent: Counter[str]) -> tuple[Callable[..., Any], GraphPlan]:
    """The accepted program, or a faster one that also fits: where the program peaks more than
    ``LOOSEN_UNDER`` under its target and recomputes something, the model over-counted, so one
    more plan is made, asked for the undershoot more, compiled only if the model predicts it
    faster by ``LOOSEN_GAIN`` of the step, and kept if its own program fits the target."""
    compiled, plan, peak = accepted
    limit = plan.target
    if limit - peak <= LOOSEN_UNDER * limit or plan.solution.added_seconds <= 0:
        return compiled, plan
    if plan.plan_cache not in ("", "stored"):  # a plan fitted (and loosened) before: loaded as it is
        return compiled, plan
    step = sum(v.seconds for v in plan.problem.values)  # every op of the step, as profiled
    faster_than = plan.solution.added_seconds - LOOSEN_GAIN * step
    asked = Attempt(setting, target=limit + (limit - peak), settle_for_lowest=True,
                    wanted=lambda looser: looser.solution.added_seconds < faster_than)
    try:  # stopped at the partitioner unless the looser plan is predicted faster: nothing to compile
        again, looser, looser_peak = compile_once(gm, example_inputs, planner, asked, compile_graph)
    except CompileStopped:
        if asked.stopped != "unwanted":
            raise
        return compiled, plan
    spent.update(looser.timings)
    if looser_peak > limit:
        return compiled, plan
    looser = looser.revised(compile_attempts=plan.compile_attempts + 1).noted(
        f"the first plan's program peaked {format_bytes(limit - peak)} under the target: "
        f"planned looser, this plan's program fits and is faster")
    log.info("remat: compiled program peaks %s under the target; a looser plan fits and is faster",
             format_bytes(limit - peak))
    return again, looser


def with_compiled_min_feasible(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner,
                               setting: GraphSetting, compile_graph: Compile, plan: GraphPlan) -> GraphPlan:
    """``plan`` with ``min_feasible_bytes`` the exact figure ``compile_fitted`` is sure
    to accept: the lower compiled peak of the smallest-peak plan and the fastest plan, plus its
    headroom. That costs up to two more compiles, so they run when the figure is first read
    (``remat.plan``), under the grad and autocast state of now."""
    restore = adapter.ambient_state()

    def compute() -> dict[str, object]:
        with restore():
            peak = lowest_compiled_peak(gm, example_inputs, planner, setting, compile_graph, plan)
        return {"min_feasible_bytes": min_budget_bytes(peak, planner.request.solve.headroom),
                "min_feasible_exact": True}

    return plan.deferring(compute, "min_feasible_bytes", "min_feasible_exact")


def lowest_compiled_peak(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, setting: GraphSetting,
                         compile_graph: Compile, plan: GraphPlan) -> int:
    """The lower compiled peak of the smallest-peak plan and (where it may be lower,
    :func:`fastest_may_be_lower`) the fastest plan, as the fitting loop finds them; ``plan``'s own
    program counts for whichever of the two it is, and one the loop compiled is not compiled again."""
    unbudgeted = planner.request.budget_bytes is None  # then the plan is the fastest already

    def peak_of(target: int) -> int:  # (a plan made only to measure: not for the plan cache)
        asked = Attempt(setting, target=target, settle_for_lowest=True, storing=False)
        return compile_unless_known(gm, example_inputs, planner, asked, compile_graph, fits_too=False)[2]

    smallest = plan.compiled_peak_bytes if plan.smallest else peak_of(SMALLEST)
    if not fastest_may_be_lower(plan, smallest):
        return smallest
    return min(smallest, plan.compiled_peak_bytes if unbudgeted else peak_of(FASTEST))


def compile_once(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, attempt: Attempt,
                 compile_graph: Compile) -> tuple[Callable[..., Any], GraphPlan | None, int]:
    """Plan and compile a copy of ``gm`` (Inductor's pre-grad passes rewrite it in place);
    the compiled callable, its plan, and the peak of the program Inductor generated.

    Inductor may load the program from its FX graph cache. For a plan from remat's plan
    cache the stored account stands for it; any other plan is compiled again, the cache
    off, so that its program is generated and accounted for."""
    program_of(attempt.setting)  # (before compiling: a setting without it is a bug, found now)
    compiled, plan, programs = compile_recorded(gm, example_inputs, planner, attempt, compile_graph)
    if plan is None:
        return compiled, None, 0
    if len(programs) < 2:  # Inductor's cache had the program: no code to read
        # a plan loaded (from the plan cache, or from rank 0) carries its program's account
        if plan.plan_cache in ("hit", "rank 0") and plan.compiled_peak_bytes is not None:
            return compiled, plan, plan.compiled_peak_bytes
        again = Attempt(attempt.setting, replay=plan)  # not planned again: the same plan, its program generated
        compiled, plan, programs = compile_recorded(gm, example_inputs, planner, again, compile_graph,
                                                    fx_graph_cache=False)
    # extern kernels' scratch, measured by the profile, placed at the line each kernel runs
    step = account.step_account(programs, plan.workspace_by_node)
    if not step.complete:
        log.warning("remat: %s; the compiled peak is a lower bound", step.incomplete_reason)
        plan = plan.noted(f"compiled account incomplete: {step.incomplete_reason}")
    # the rank's memory outside the graph (budget_scope "rank"): the program's peak is one part of it,
    # and so is what it hands the backward while the eager head and loss run between the two
    program = ProgramAccount(step.peak_bytes, step.handoff_bytes,
                             (step.forward_peak_bytes, step.backward_peak_bytes, step.output_bytes))
    peak = compiled_rank_peak(plan, program, plan.problem.handoff_bytes)
    plan = plan.revised(program=program, compiled_peak_bytes=peak)
    KNOWN.remember(program_of(attempt.setting), plan.solution, plan.workspace_by_node, program)
    return compiled, plan, peak


def compile_recorded(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, attempt: Attempt,
                     compile_graph: Compile, **options: Any) -> tuple[Callable[..., Any], GraphPlan | None, list]:
    """Compile a copy of ``gm``; the callable, the plan it got (its Inductor seconds recorded;
    None for an inference graph, which has no backward to plan) and the programs Inductor
    generated for it (none when its cache had them)."""
    # the program's AOTAutograd cache entry, kept unwritten until its plan is accepted (passes/cache/program_cache.py)
    recording = adapter.recording_program_entries() if attempt.setting.record_programs else contextlib.nullcontext([])
    # (recording inside the chooser's settings, which turn AOTAutograd's cache off for any other compile)
    with account.capture_programs() as programs, choosing(planner, attempt), recording as entries:
        compiled = compile_graph(copy.deepcopy(gm), example_inputs, on_graph=attempt.on_graph, **options)
    plan = attempt.plan
    if plan is None:
        return compiled, None, programs
    plan = plan.timed("inductor", time.perf_counter() - attempt.chosen_at)
    if entries:  # (a compile with Inductor's cache off makes none: the plan keeps an earlier one)
        plan = plan.revised(program_entry=entries[-1])
    return compiled, plan, programs


def over_budget(plan: GraphPlan, peak: int) -> BudgetError:
    """The error when no plan's compiled program fits: ``peak`` is the lowest one found."""
    request = plan.request.solve
    why = f"the program Inductor generates for the lowest plan remat found peaks at {format_bytes(peak)}"
    return budget_error(request.budget_bytes, min_budget_bytes(peak, request.headroom), request.headroom, why,
                        under="Inductor")
