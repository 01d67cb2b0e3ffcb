"""Cheap plans on the same Problem/Solution types as the ILP.

They give the ILP its warm start, the tests their yardsticks ("the ILP is
never worse than any of them") and bench/ its comparisons.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from .errors import InvalidPlan
from .model import (
    Interval,
    candidate_users,
    clip,
    copies_bytes,
    direct_start,
    exact_starts,
    keep_interval,
    recomputable,
    recompute_interval,
    whole_run,
)
from .problem import Problem, Value, storage_of
from .simulate import canonical, evaluate
from .solution import Solution

log = logging.getLogger(__name__)

_MAX_PASSES = 4  # greedy passes over the candidates; later passes rarely help
_TINY_SECONDS = 1e-12  # stands in for a zero recompute time when ranking


def store_all(problem: Problem) -> Solution:
    """Keep everything the backward reads; views are recomputed from their bases."""
    start = time.perf_counter()
    saved = _walk_saved(problem, lambda v: v.savable)
    return _timed(evaluate(problem, saved, solver="store-all"), start)


def recompute_all(problem: Problem) -> Solution:
    """Keep only what cannot be recomputed (banned ops and their kin)."""
    start = time.perf_counter()
    saved = _walk_saved(problem, _keep_only_what_cannot_be_recomputed(problem))
    return _timed(evaluate(problem, saved, solver="recompute-all"), start)


def _keep_only_what_cannot_be_recomputed(problem: Problem) -> Callable[[Value], bool]:
    can_recompute = recomputable(problem)

    def keep(value: Value) -> bool:
        if value.name in can_recompute:
            return False
        if not value.savable:
            raise InvalidPlan(f"{value.name} can be neither kept (a view) nor recomputed")
        return True

    return keep


# What Megatron-style selective checkpointing keeps (categories of ``Value.category``).
MATMUL_CLASS = frozenset({"matmul", "attention", "convolution"})


def save_matmuls(problem: Problem) -> Solution:
    """Megatron-style selective checkpointing in the model: keep matmul-class outputs (and
    what cannot be recomputed), recompute everything else the backward needs."""
    start = time.perf_counter()
    otherwise = _keep_only_what_cannot_be_recomputed(problem)
    saved = _walk_saved(problem, lambda v: (v.category in MATMUL_CLASS and v.savable) or otherwise(v))
    return _timed(evaluate(problem, saved, solver="save-matmuls"), start)


def checkpoint_blocks(problem: Problem) -> Solution:
    """Checkpoint per block in the model (``torch.utils.checkpoint`` around each of the model's
    repeated blocks): keep what the rest of the graph computes, as autograd would, and each
    block's outputs that another block or the rest reads (the next block's checkpointed input);
    recompute everything else inside the blocks. Without blocks (``Value.block``) it is store-all."""
    start = time.perf_counter()
    otherwise = _keep_only_what_cannot_be_recomputed(problem)
    outputs = block_outputs(problem)
    saved = _walk_saved(problem, lambda v: (v.savable and (not v.block or v.name in outputs)) or otherwise(v))
    return _timed(evaluate(problem, saved, solver="checkpoint-blocks"), start)


def block_outputs(problem: Problem) -> frozenset[str]:
    """Values of a block that a value outside it reads; a view stands for its base's storage."""
    by_name = problem.by_name()
    crossing = set()
    for value in problem.values:
        for name in (storage_of(by_name, n) for n in value.operands):
            operand = by_name.get(name)
            if operand is not None and operand.block and operand.block != value.block:
                crossing.add(name)
    return frozenset(crossing)


def cheap_plans(problem: Problem, budget: int) -> list[Solution]:
    """Plans made without an ILP: store-all, greedy toward ``budget``, recompute-all, and the
    peers' rules in the model (checkpoint per block, save matmuls)."""
    return [store_all(problem), greedy(problem, budget), recompute_all(problem), checkpoint_blocks(problem),
            save_matmuls(problem)]


def _walk_saved(problem: Problem, keep: Callable[[Value], bool]) -> frozenset[str]:
    """Walk back from what the backward reads: kept values stop the walk,
    recomputed ones continue into their operands."""
    by_name = problem.by_name()
    stack = [(v.name, False) for v in problem.candidates() if v.direct_need]
    seen: set[tuple[str, bool]] = set()
    saved: set[str] = set()
    while stack:
        name, must_keep = stack.pop()
        if (name, must_keep) in seen or name not in by_name:
            continue  # an unknown operand is reported by evaluate's check
        seen.add((name, must_keep))
        value = by_name[name]
        if must_keep or keep(value):
            saved.add(name)
        else:
            stack.extend((u, False) for u in value.operands)
            stack.extend((u, True) for u in value.keep_operands)
    return canonical(problem, saved)


def _timed(solution: Solution, start: float) -> Solution:
    return replace(solution, solve_seconds=time.perf_counter() - start)


@dataclass(frozen=True)
class _Move:
    """Recompute ``name`` instead of keeping it, keeping or recomputing the
    operands that this newly needs."""

    name: str
    new_saved: tuple[str, ...]
    new_recomputed: tuple[str, ...]
    starts: tuple[tuple[str, int], ...]  # where each newly recomputed value is first needed
    deltas: tuple[tuple[Interval | None, int], ...]  # (interval, bytes added)


class _Greedy:
    """The current plan and its timeline, so moves are scored incrementally."""

    def __init__(self, problem: Problem, plan: Solution) -> None:
        self.problem = problem
        self.by_name = problem.by_name()
        self.recomputable = recomputable(problem)
        self.saved = set(plan.saved)
        self.recomputed = set(plan.recomputed)
        self.mem = list(plan.timeline)
        self.users = candidate_users(problem)
        self.starts = exact_starts(problem, self.recomputed)

    def start_of(self, value: Value, extra: tuple[int, ...] = ()) -> int | None:
        """Where ``value`` would first be needed if recomputed now."""
        times = [direct_start(value), *extra, *(self.starts[w] for w in self.users[value.name] if w in self.starts)]
        times = [t for t in times if t is not None]
        return min(times) if times else value.need_start

    def shifts(self, value: Value, start: int) -> bool:
        """Recomputing ``value`` at ``start`` would move an already recomputed
        operand earlier: a change this move's deltas do not describe."""
        return any(self.starts.get(u, -1) > start for u in value.operands)

    def move(self, value: Value) -> _Move | None:
        """The move for ``value``, or None when it is not kept or cannot be recomputed."""
        if value.name not in self.saved or value.name not in self.recomputable:
            return None
        if self.blocked(value):
            return None
        start = self.start_of(value)
        if start is None or self.shifts(value, start):
            return None
        deltas = [(keep_interval(value), -value.bytes), (whole_run(self.problem), -copies_bytes(self.problem, value)),
                  (recompute_interval(value, start), value.held_when_recomputed)]
        new_saved: list[str] = []
        new_recomputed, starts = [value.name], [(value.name, start)]
        stack = [(u, u in value.keep_operands, start) for u in (*value.operands, *value.keep_operands)]
        while stack:
            operand, must_keep, needed_at = stack.pop()
            u = self.by_name[operand]  # recomputable: every operand is a known candidate
            if must_keep and (u.name in self.recomputed or u.name in new_recomputed):
                return None
            if u.name in self.saved or u.name in self.recomputed:
                continue
            if u.name in new_saved or u.name in new_recomputed:
                continue
            if u.savable:
                new_saved.append(u.name)
                deltas += [(keep_interval(u), u.bytes), (whole_run(self.problem), copies_bytes(self.problem, u))]
            else:  # a view: recomputable, since its user is
                view_start = self.start_of(u, (needed_at,))
                if view_start is None or self.shifts(u, view_start):
                    return None
                new_recomputed.append(u.name)
                starts.append((u.name, view_start))
                deltas.append((recompute_interval(u, view_start), u.held_when_recomputed))
                stack.extend((x, x in u.keep_operands, view_start) for x in (*u.operands, *u.keep_operands))
        return _Move(value.name, tuple(new_saved), tuple(new_recomputed), tuple(starts), tuple(deltas))

    def blocked(self, value: Value) -> bool:
        """A recomputed user of ``value`` needs it kept."""
        return any(value.name in self.by_name[w].keep_operands for w in self.recomputed)

    def score(self, pieces: list[tuple[int, int, int]]) -> tuple[int, int]:
        """(peak, steps at peak) after adding ``pieces``; slices keep it at C speed."""
        peak = max(max(self.mem[a:b]) + add for a, b, add in pieces)
        count = sum(self.mem[a:b].count(peak - add) for a, b, add in pieces)
        return peak, count

    def apply(self, move: _Move, pieces: list[tuple[int, int, int]]) -> None:
        for a, b, add in pieces:
            if add:
                self.mem[a:b] = [m + add for m in self.mem[a:b]]
        self.saved.discard(move.name)
        self.saved.update(move.new_saved)
        self.recomputed.update(move.new_recomputed)
        self.starts.update(move.starts)


def _pieces(
    deltas: tuple[tuple[Interval | None, int], ...], num_steps: int
) -> list[tuple[int, int, int]]:
    """Split ``0 .. num_steps`` into runs ``[a, b)`` of constant added bytes."""
    diff: dict[int, int] = {0: 0, num_steps: 0}
    for interval, nbytes in deltas:
        span = clip(interval, num_steps)
        if span is not None:
            diff[span[0]] = diff.get(span[0], 0) + nbytes
            diff[span[1] + 1] = diff.get(span[1] + 1, 0) - nbytes
    points = sorted(diff)
    pieces, add = [], 0
    for a, b in zip(points, points[1:]):
        add += diff[a]
        pieces.append((a, b, add))
    return pieces


def greedy(problem: Problem, budget_bytes: int | None) -> Solution:
    """Start from store-all; recompute kept values while that lowers the peak.

    Candidates are tried in order of bytes freed per recompute second; a move
    is accepted when it lowers (peak, steps at peak). Each pass is O(n * T)
    at C speed; at most ``_MAX_PASSES`` passes. ``None`` means no budget,
    so store-all is returned.
    """
    start = time.perf_counter()
    plan = store_all(problem)
    if budget_bytes is None or plan.peak_bytes <= budget_bytes or problem.num_steps == 0:
        return _timed(replace(plan, solver="greedy"), start)
    state = _Greedy(problem, plan)
    order = sorted(
        (v for v in problem.candidates() if v.name in state.recomputable),
        key=lambda v: (-v.bytes / max(v.recompute_seconds, _TINY_SECONDS), v.name),
    )
    best = state.score([(0, problem.num_steps, 0)])
    for _ in range(_MAX_PASSES):
        before = best
        best = _greedy_pass(state, order, best, budget_bytes, problem.num_steps)
        if best == before or best[0] <= budget_bytes:
            break
    result = evaluate(problem, state.saved, solver="greedy")
    if result.peak_bytes > budget_bytes:
        log.debug("greedy: peak %d stays above budget %d", result.peak_bytes, budget_bytes)
        result = replace(result, notes=(f"over budget: peak {result.peak_bytes} > {budget_bytes}",))
    return _timed(result, start)


def _greedy_pass(
    state: _Greedy, order: list[Value], best: tuple[int, int], budget_bytes: int, num_steps: int
) -> tuple[int, int]:
    for value in order:
        if best[0] <= budget_bytes:
            break
        move = state.move(value)
        if move is None:
            continue
        pieces = _pieces(move.deltas, num_steps)
        score = state.score(pieces)
        if score < best:
            state.apply(move, pieces)
            best = score
    return best
