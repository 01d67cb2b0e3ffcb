"""Evaluate a keep/recompute plan under the model: validity, memory, time.

A plan is the pair (saved, recomputed) of candidate names. ``evaluate``
takes only ``saved`` and derives the smallest ``recomputed`` that makes it
valid (``closure``), which is what every solver reports.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from .errors import InvalidPlan
from .model import (
    add_interval,
    clip,
    exact_starts,
    copies_bytes,
    fixed_diff,
    fixed_interval,
    keep_interval,
    recompute_interval,
    running_sum,
    step_workspace,
    whole_run,
)
from .problem import Problem, Value
from .solution import Solution, Status

_MAX_REASONS = 5  # an InvalidPlan message lists this many broken rules


def closure(problem: Problem, saved: Collection[str]) -> frozenset[str]:
    """The minimal recompute set implied by keeping exactly ``saved``.

    Directly needed candidates that are not saved are recomputed, then every
    operand of a recomputed value that is not saved, transitively.
    """
    by_name, saved = problem.by_name(), frozenset(saved)
    stack = [v.name for v in problem.candidates() if v.direct_need and v.name not in saved]
    recomputed: set[str] = set()
    while stack:
        name = stack.pop()
        if name in recomputed:
            continue
        recomputed.add(name)
        value = by_name.get(name)
        operands = value.operands if value is not None else ()
        stack.extend(u for u in operands if u not in saved and u not in recomputed)
    return frozenset(recomputed)


def canonical(problem: Problem, saved: Collection[str]) -> frozenset[str]:
    """``saved`` minus the values nothing needs.

    A value is needed when the backward reads it or it is an operand of a
    recomputed value; keeping any other value only costs memory and time.
    """
    by_name = problem.by_name()
    needed = {v.name for v in problem.candidates() if v.direct_need}
    for name in closure(problem, saved):
        value = by_name.get(name)
        needed.update(value.operands if value is not None else ())
    return frozenset(s for s in saved if s in needed)


def check_plan(problem: Problem, saved: Collection[str], recomputed: Collection[str]) -> None:
    """Raise InvalidPlan listing every rule of the model the plan breaks."""
    by_name, saved, recomputed = problem.by_name(), frozenset(saved), frozenset(recomputed)
    reasons = _unknown_names(by_name, saved, recomputed)
    reasons += [f"{n} is both saved and recomputed" for n in sorted(set(saved) & set(recomputed))]
    reasons += [f"{n} is saved but unsavable (a view)" for n in sorted(saved) if _unsavable(by_name, n)]
    for name in sorted(recomputed):
        reasons += _recompute_reasons(by_name, name, saved, recomputed)
    covered = set(saved) | set(recomputed)
    reasons += [
        f"{v.name} is needed by the backward but neither saved nor recomputed"
        for v in problem.candidates()
        if v.direct_need and v.name not in covered
    ]
    if reasons:
        more = len(reasons) - _MAX_REASONS
        tail = f" (+{more} more)" if more > 0 else ""
        raise InvalidPlan("invalid plan: " + "; ".join(reasons[:_MAX_REASONS]) + tail)


def _unknown_names(by_name: dict[str, Value], *plans: Iterable[str]) -> list[str]:
    names = sorted({n for plan in plans for n in plan})
    return [
        f"{n} is not a candidate (not a forward value the backward may need)"
        for n in names
        if n not in by_name or not by_name[n].is_candidate
    ]


def _unsavable(by_name: dict[str, Value], name: str) -> bool:
    return name in by_name and not by_name[name].savable


def _recompute_reasons(
    by_name: dict[str, Value], name: str, saved: Collection[str], recomputed: Collection[str]
) -> list[str]:
    value = by_name.get(name)
    if value is None:
        return []
    reasons = []
    if value.recompute_ban is not None:
        reasons.append(f"{name} is recomputed but banned ({value.recompute_ban})")
    for u in value.operands:
        if u not in by_name or not by_name[u].is_candidate:
            reasons.append(f"{name} is recomputed but its operand {u} is not a candidate")
        elif u not in saved and u not in recomputed:
            reasons.append(f"{name} is recomputed but its operand {u} is neither saved nor recomputed")
    for u in value.keep_operands:
        if u not in saved:
            reasons.append(f"{name} is recomputed, so {u} must be kept, not recomputed")
    return reasons


def timeline(problem: Problem, saved: Iterable[str], recomputed: Iterable[str],
             starts: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """Bytes alive at each step, workspace included, in O(T + n).

    A recomputed value is alive from ``starts[name]``: by default where the
    plan first needs it (``exact_starts``).
    """
    by_name = problem.by_name()
    saved, recomputed = list(saved), list(recomputed)
    unknown = _unknown_names(by_name, saved, recomputed)
    if unknown:
        raise InvalidPlan("invalid plan: " + "; ".join(unknown[:_MAX_REASONS]))
    if starts is None:
        starts = exact_starts(problem, set(recomputed))
    diff = fixed_diff(problem)
    for name in saved:
        add_interval(diff, keep_interval(by_name[name]), by_name[name].bytes)
        add_interval(diff, whole_run(problem), copies_bytes(problem, by_name[name]))
    for name in recomputed:
        value = by_name[name]
        add_interval(diff, recompute_interval(value, starts.get(name)), value.held_when_recomputed)
    return tuple(m + w for m, w in zip(running_sum(diff), step_workspace(problem, recomputed, starts)))


def alive_at(problem: Problem, saved: Iterable[str], recomputed: Iterable[str],
             step: int) -> list[tuple[Value, str, int]]:
    """What the plan holds at ``step``: (value, why, bytes) for every value alive there, by the
    same intervals as :func:`timeline`, so their bytes plus the step's workspace sum to
    ``timeline(...)[step]`` less ``outside_with_copies`` (the problem's ``outside_bytes`` and other
    copies' kept values, which no value of this graph owns) and, at the forward's last step, the
    problem's ``handoff_bytes``. ``why``: "fixed" (alive whatever the
    plan), "kept" or "recomputed"."""
    saved, recomputed = frozenset(saved), frozenset(recomputed)
    starts = exact_starts(problem, recomputed)

    def covers(interval: tuple[int, int] | None) -> bool:
        span = clip(interval, problem.num_steps)
        return span is not None and span[0] <= step <= span[1]

    alive = []
    for value in problem.values:
        if value.fixed_bytes and covers(fixed_interval(value, problem.num_steps)):
            alive.append((value, "fixed", value.fixed_bytes))
        if value.name in saved and value.bytes and covers(keep_interval(value)):
            alive.append((value, "kept", value.bytes))
        if value.name in recomputed and value.held_when_recomputed and covers(
                recompute_interval(value, starts.get(value.name))):
            alive.append((value, "recomputed", value.held_when_recomputed))
    return alive


def added_seconds(problem: Problem, saved: Iterable[str], recomputed: Iterable[str]) -> float:
    """The objective: recompute time of ``recomputed`` plus save time of ``saved``."""
    by_name = problem.by_name()
    return sum(by_name[n].recompute_seconds for n in recomputed) + sum(
        by_name[n].save_seconds for n in saved
    )


def evaluate(
    problem: Problem,
    saved: Collection[str],
    *,
    solver: str = "evaluate",
    status: Status = Status.HEURISTIC,
    bound: float | None = None,
    gap: float | None = None,
    solve_seconds: float = 0.0,
    notes: tuple[str, ...] = (),
) -> Solution:
    """The Solution that keeps exactly ``saved`` and recomputes its closure.

    Raises InvalidPlan when no valid plan keeps exactly ``saved``.
    """
    saved = frozenset(saved)
    recomputed = closure(problem, saved)
    check_plan(problem, saved, recomputed)
    line = timeline(problem, saved, recomputed)
    return Solution(
        solver=solver,
        saved=saved,
        recomputed=recomputed,
        peak_bytes=max(line, default=0),
        timeline=line,
        added_seconds=added_seconds(problem, saved, recomputed),
        status=status,
        bound=bound,
        gap=gap,
        solve_seconds=solve_seconds,
        notes=notes,
    )
