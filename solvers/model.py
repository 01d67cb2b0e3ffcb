"""The memory model, written once: which steps each value is alive at.

Every other module (simulate, baselines, ilp) builds on these functions so
that the integer program, the simulator and the heuristics cannot disagree.
Intervals are inclusive step ranges ``(first, last)``; ``None`` is empty.

For a candidate ``v`` (a FORWARD value the backward may need):

- ``A_v = [produced, last_use]``: alive whatever the plan (``fixed_interval``);
- ``K_v = (last_use, need_end]``: extra steps alive when kept (``keep_interval``);
  for a value Inductor fuses away in the forward (``fused_in_forward``),
  ``A_v`` holds no bytes and ``K_v`` starts at ``produced``;
- ``Q_v = [start, need_end]``: alive again when recomputed; memory
  counts ``Q_v`` minus ``A_v`` (``recompute_interval``), so a value is
  counted once at a step however many of its intervals cover it.
  ``start`` is where the plan first needs ``v`` (``exact_starts``): torch
  recomputes a value just before its first consumer in the backward, which
  is its own first direct read or the recomputation of a user. The ILP tracks
  ``start`` exactly through ``start_segments``; ``need_start`` bounds them all.

Every other value has only its fixed interval: INPUTs the whole run,
BACKWARD and non-candidate FORWARD values ``[produced, last_use]``.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from .problem import Kind, Problem, Value

Interval = tuple[int, int]
# Start steps the program distinguishes per recomputed value before its own
# first read. Every distinct start a chain of recomputed users can give it is a
# segment boundary; beyond this many, the earliest ones merge into one segment
# that counts the value from the earliest boundary (an over-count, never an
# under-count). See FORMULATION.md for the measurements behind the number.
MAX_SEGMENTS = 16


@dataclass(frozen=True)
class Starts:
    """Where a recomputed candidate's memory may begin (``start_segments``).

    ``read`` is its first direct read (``None`` when only recomputed users
    read it): recomputed, it is alive from there to ``need_end``. ``bounds``
    are the ascending steps before ``read`` where a recomputed user may need it
    first; segment ``k`` runs from ``bounds[k]`` to the step before the next
    bound (the last one to ``read - 1``, or to ``need_end`` without a read).
    """

    read: int | None
    bounds: tuple[int, ...]

    def segments(self, need_end: int) -> list[Interval]:
        ends = [b - 1 for b in self.bounds[1:]] + [need_end if self.read is None else self.read - 1]
        return list(zip(self.bounds, ends))

    def segment_at(self, step: int) -> int | None:
        """The index of the segment holding ``step``; None before the first."""
        return bisect.bisect_right(self.bounds, step) - 1 if self.bounds and step >= self.bounds[0] else None

    @property
    def earliest(self) -> int | None:
        return self.bounds[0] if self.bounds else self.read


def fixed_interval(value: Value, num_steps: int) -> Interval:
    """Steps ``value`` is alive at whatever the plan decides."""
    if value.kind is Kind.INPUT:
        return (0, num_steps - 1)
    return (value.produced, value.last_use)


def need_interval(value: Value) -> Interval | None:
    """``[need_start, need_end]``: where the backward may need a candidate."""
    if value.need_start is None:
        return None
    end = value.need_end if value.need_end is not None else value.need_start
    return (value.need_start, end)


def keep_interval(value: Value) -> Interval | None:
    """``K_v``: steps a kept candidate is alive beyond ``A_v``."""
    need = need_interval(value)
    if need is None:
        return None
    if value.fused_in_forward:  # written only because it is kept
        return (value.produced, max(need[1], value.last_use))
    if need[1] <= value.last_use:
        return None
    return (value.last_use + 1, need[1])


def recompute_interval(value: Value, start: int | None = None) -> Interval | None:
    """``Q_v`` minus ``A_v``: steps a recomputed candidate is alive beyond ``A_v``.

    ``start`` is where the plan first needs it (``need_start``, the earliest
    possible, when not given). A value still alive from the forward (a
    forward output) is not counted twice where ``Q_v`` overlaps ``A_v``.
    """
    need = need_interval(value)
    if need is None:
        return None
    if start is not None:
        need = (start, need[1])
    if value.fused_in_forward:
        return need
    if need[1] <= value.last_use:
        return None
    return (max(need[0], value.last_use + 1), need[1])


def clip(interval: Interval | None, num_steps: int) -> Interval | None:
    """The part of ``interval`` inside ``0 .. num_steps - 1``."""
    if interval is None:
        return None
    first, last = max(interval[0], 0), min(interval[1], num_steps - 1)
    return (first, last) if first <= last else None


def add_interval(diff: list[int], interval: Interval | None, nbytes: int) -> None:
    """Add ``nbytes`` over ``interval`` to a difference array of T + 1 entries.

    Difference arrays keep a whole timeline O(T + n) instead of O(T * n).
    """
    span = clip(interval, len(diff) - 1)
    if span is None or nbytes == 0:
        return
    diff[span[0]] += nbytes
    diff[span[1] + 1] -= nbytes


def fixed_diff(problem: Problem) -> list[int]:
    """Difference array of the memory that no decision changes (``outside_bytes`` included)."""
    diff = [0] * (problem.num_steps + 1)
    for value in problem.values:
        add_interval(diff, fixed_interval(value, problem.num_steps), value.fixed_bytes)
    add_interval(diff, whole_run(problem), problem.outside_bytes)
    add_interval(diff, handoff_step(problem), problem.handoff_bytes)
    return diff


def handoff_step(problem: Problem) -> Interval | None:
    """The forward's last step: the graph holds there at least what it hands the backward, which
    is alive while the caller's code between forward and backward (``Problem.handoff``) runs."""
    last = problem.num_forward_steps - 1
    return (last, last) if last >= 0 else None


def whole_run(problem: Problem) -> Interval | None:
    """Every step: where ``outside_bytes`` and the other copies' kept values are alive."""
    return (0, problem.num_steps - 1) if problem.num_steps else None


def copies_bytes(problem: Problem, value: Value) -> int:
    """What keeping ``value`` costs in the other copies of the graph, at every step."""
    return problem.kept_copies * value.bytes


def copies_kept_bytes(problem: Problem, saved: Iterable[str]) -> int:
    """What the other copies of the graph hold of a plan that keeps ``saved``, at every step."""
    by_name = problem.by_name()
    return sum(copies_bytes(problem, by_name[name]) for name in saved)


def outside_with_copies(problem: Problem, saved: Iterable[str]) -> int:
    """What a plan's peak adds to its graph's own at every step: the memory outside the graph
    (``Problem.outside``) and the other copies' kept values."""
    return problem.outside_bytes + copies_kept_bytes(problem, saved)


def running_sum(diff: Iterable[int]) -> list[int]:
    """Prefix sums of a difference array, dropping its sentinel entry."""
    total, out = 0, []
    for delta in diff:
        total += delta
        out.append(total)
    return out[:-1]


def workspace(problem: Problem) -> list[int]:
    """Per-step workspace, zeros when the problem has none."""
    return [problem.workspace_at(t) for t in range(problem.num_steps)]


def op_workspace(problem: Problem, value: Value) -> int:
    """The scratch of the op that produces ``value`` (its step's workspace), needed again
    wherever the value is recomputed; none where the recomputation is fused into its consumers
    (``recompute_bytes`` 0: Inductor's generated kernels allocate nothing)."""
    if not value.held_when_recomputed or not 0 <= value.produced < problem.num_steps:
        return 0
    return problem.workspace_at(value.produced)


def step_workspace(problem: Problem, recomputed: Iterable[str], starts: Mapping[str, int]) -> list[int]:
    """Workspace at each step under a plan: the step's own op's, or the larger scratch of an op
    recomputed there. torch recomputes a value just before its first consumer (its start), so
    that op's scratch is held beside everything alive at the start (the op of that step has not
    run yet: the two scratches are never held together). The scratch also counts at each later
    step where a start of the value is possible (``scratch_steps``), an over-count that lets the
    program state it without start indicators (FORMULATION.md)."""
    by_name, ws = problem.by_name(), workspace(problem)
    needy = [name for name in recomputed if op_workspace(problem, by_name[name])]
    segments = start_segments(problem) if needy else {}
    for name in needy:
        scratch = op_workspace(problem, by_name[name])
        for step in scratch_steps(segments[name], starts.get(name), problem.num_steps):
            ws[step] = max(ws[step], scratch)
    return ws


def scratch_steps(starts: Starts, start: int | None, num_steps: int) -> list[int]:
    """Where a value recomputed from ``start`` counts its op's scratch: there, and at each later
    segment bound and its first read."""
    later = [t for t in (*starts.bounds, *(() if starts.read is None else (starts.read,))) if start is None or t > start]
    return [t for t in ([] if start is None else [start]) + later if 0 <= t < num_steps]


def recomputable(problem: Problem) -> frozenset[str]:
    """Candidates that may be recomputed: ``R_v`` can be 1.

    ``v`` qualifies when it is not banned and every operand is a candidate
    that can itself be kept or recomputed; operands come before users in
    ``problem.values``, so one pass in production order suffices.
    """
    by_name = problem.by_name()
    ok: set[str] = set()
    for value in problem.values:
        if not value.is_candidate or value.recompute_ban is not None:
            continue
        keep = value.keep_operands
        if all(_plannable(by_name.get(u), ok) for u in value.operands) and all(
            u in by_name and by_name[u].is_candidate and by_name[u].savable for u in keep
        ):
            ok.add(value.name)
    return frozenset(ok)


def _plannable(value: Value | None, recomputable_names: set[str]) -> bool:
    if value is None or not value.is_candidate:
        return False
    return value.savable or value.name in recomputable_names


def direct_start(value: Value) -> int | None:
    """The first backward step that reads ``value`` itself (or an alias)."""
    if value.direct_start is not None:
        return value.direct_start
    return value.need_start if value.direct_need else None


def candidate_users(problem: Problem) -> dict[str, list[str]]:
    """For each candidate, the candidates that have it as an operand."""
    users: dict[str, list[str]] = {v.name: [] for v in problem.candidates()}
    for v in problem.candidates():
        for u in v.operands:
            if u in users:
                users[u].append(v.name)
    return users


def exact_starts(problem: Problem, recomputed: Collection[str]) -> dict[str, int]:
    """Where each recomputed value is first needed under this plan.

    Its first direct read, or the start of a recomputed user that reads it,
    whichever comes first; users come after their operands, so one pass in
    reverse production order settles every start.
    """
    users, starts = candidate_users(problem), {}
    for v in reversed(problem.candidates()):
        if v.name not in recomputed:
            continue
        first = direct_start(v)
        times = [t for t in [first, *(starts.get(w) for w in users[v.name])] if t is not None]
        starts[v.name] = min(times) if times else v.need_start
    return starts


def start_segments(problem: Problem, max_segments: int = MAX_SEGMENTS) -> dict[str, Starts]:
    """For every candidate, the steps the program distinguishes as its start.

    A value is first needed at its own first read or at the start of a
    recomputed user, so its possible starts before that read are the user's
    possible starts; one pass in reverse production order collects them. Only
    the latest ``max_segments - 1`` stay exact: the earlier ones come from long
    chains of users recomputed before their own reads, rarely worth their memory.
    """
    users, found, may_recompute = candidate_users(problem), {}, recomputable(problem)
    for v in reversed(problem.candidates()):
        read = direct_start(v)
        starters = [w for w in users[v.name] if w in may_recompute]  # a kept user starts nothing
        bounds = {t for w in starters for t in _starts_of(found.get(w)) if read is None or t < read}
        ordered = sorted(bounds)
        if read is None and not ordered:
            ordered = [v.need_start]
        if len(ordered) > max_segments:  # the earliest, so every user start has a segment, and the latest
            ordered = ordered[:1] + ordered[len(ordered) - max_segments + 1:]
        found[v.name] = Starts(read, tuple(ordered))
    return found


def _starts_of(starts: Starts | None) -> tuple[int, ...]:
    if starts is None:
        return ()
    return starts.bounds + ((starts.read,) if starts.read is not None else ())
