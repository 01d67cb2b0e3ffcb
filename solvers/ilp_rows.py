"""The rows of FORMULATION.md's integer program: its constraints and its objective.

``add_constraints`` adds the need, keep_or_recompute, started, operand, memory, peak and
scratch rows (each family named as in FORMULATION.md) to a :class:`.ilp_model.Model` that
:func:`.ilp.add_variables` made; ``add_objective`` adds the objective, time or peak with the
other as a tie-break worth at most ``TIE_BREAK``. :func:`.ilp.build_model` calls both.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulp

from .errors import InvalidPlan
from .ilp_model import Model, Objective
from .model import (
    Interval,
    clip,
    copies_bytes,
    fixed_diff,
    keep_interval,
    need_interval,
    op_workspace,
    recompute_interval,
    whole_run,
    workspace,
)
from .problem import Problem, Value

TIE_BREAK = 1e-3  # the tie-break term's largest value, in units of the main term's smallest


def add_constraints(model: Model, problem: Problem) -> None:
    """need, keep_or_recompute, operand, memory and peak rows."""
    _add_decision_rows(model)
    fixed = fixed_diff(problem)
    starts = _add_memory_rows(model, problem, fixed)
    _add_peak_rows(model, problem, fixed, starts)


def _add_decision_rows(model: Model) -> None:
    for i, v in enumerate(model.candidates):
        s, r = model.S.get(v.name), model.R.get(v.name)
        choices = [x for x in (s, r) if x is not None]
        if v.direct_need and not choices:
            raise InvalidPlan(f"{v.name} is needed but can be neither kept nor recomputed")
        shared = v.name in model.ties  # its representative's rows already hold these decisions
        if v.direct_need and not shared:
            model.prob += pulp.lpSum(choices) == 1, f"need_{i}"
        elif len(choices) >= 2 and not shared:
            model.prob += pulp.lpSum(choices) <= 1, f"keep_or_recompute_{i}"
        if r is None:  # never recomputed: no start and no operand rule
            continue
        _add_start_rows(model, i, v, r)
        for j, u in enumerate(v.keep_operands):
            kept = [model.S[u]] if u in model.S else []
            model.prob += r - pulp.lpSum(kept) <= 0, f"keep_operand_{i}_{j}"


def _add_start_rows(model: Model, i: int, v: Value, r: pulp.LpVariable) -> None:
    """Alive in a segment means alive in every later one and recomputed
    (``started``); wherever v starts, each operand is ready (``operand``).
    An operand row a tied copy repeats word for word is added once."""
    alive, starts = model.L[v.name], model.starts[v.name]
    for k, x in enumerate(alive):
        _at_most(model, x, [alive[k + 1] if k + 1 < len(alive) else r], f"started_{i}_{k}")
    begins = list(zip(starts.bounds, alive))
    if starts.read is not None:
        begins.append((starts.read, r))
    for k, (step, x) in enumerate(begins):
        for j, u in enumerate(v.operands):
            _at_most(model, x, _ready_at(model, u, step), f"operand_{i}_{k}_{j}")


def _at_most(model: Model, x: pulp.LpVariable, bound: list[pulp.LpVariable], name: str) -> None:
    """The row ``x <= sum(bound)``, once: tied copies repeat their representative's rows."""
    key = (x.name, *sorted(y.name for y in bound))
    if key not in model.rows:
        model.rows.add(key)
        model.prob += x - pulp.lpSum(bound) <= 0, name


def _ready_at(model: Model, name: str, step: int) -> list[pulp.LpVariable]:
    """The decisions that have ``name`` in memory at ``step``: kept, or
    recomputed and alive there (from its read on, or in the segment holding
    ``step``). With none, the operand must be kept."""
    kept = [model.S[name]] if name in model.S else []
    if name not in model.R:
        return kept
    starts = model.starts[name]
    if starts.read is not None and step >= starts.read:
        return kept + [model.R[name]]
    k = starts.segment_at(step)
    return kept + ([model.L[name][k]] if k is not None else [])


def _add_memory_rows(model: Model, problem: Problem, fixed: list[int]) -> list[bool]:
    """M_t = M_(t-1) + f_t + (decisions starting at t) - (decisions ending at t-1).

    ``fixed`` holds f_t, the plan-independent change at t. Each decision
    enters exactly two rows. Returns, per step, whether some decision starts
    there (memory can rise).
    """
    T, unit = problem.num_steps, model.scales.bytes
    terms: list[list[tuple[pulp.LpVariable, float]]] = [[] for _ in range(T)]
    starts = [False] * T
    for v in model.candidates:
        decisions = [(model.S.get(v.name), keep_interval(v), v.bytes),
                     (model.S.get(v.name), whole_run(problem), copies_bytes(problem, v))]
        decisions += [(x, span, v.held_when_recomputed) for x, span in _recompute_spans(model, v)]
        for var, interval, nbytes in decisions:
            span = clip(interval, T)
            if var is None or span is None or nbytes == 0:
                continue
            terms[span[0]].append((var, -nbytes / unit))
            starts[span[0]] = True
            if span[1] + 1 < T:
                terms[span[1] + 1].append((var, nbytes / unit))
    for t in range(T):
        links = [(model.M[t], 1.0)] + ([(model.M[t - 1], -1.0)] if t else [])
        model.prob += _affine(links + terms[t]) == fixed[t] / unit, f"memory_{t}"
    return starts


def _recompute_spans(model: Model, v: Value) -> list[tuple[pulp.LpVariable, Interval | None]]:
    """R_v over its interval from the read; each L_v,k over its segment, both
    within ``recompute_interval`` (not counted where ``A_v`` already is)."""
    if v.name not in model.R:
        return []
    starts, end = model.starts[v.name], need_interval(v)[1]
    spans = [(model.R[v.name], recompute_interval(v, starts.read) if starts.read is not None else None)]
    for x, (first, last) in zip(model.L[v.name], starts.segments(end)):
        whole = recompute_interval(v, first)
        spans.append((x, None if whole is None else (max(first, whole[0]), min(last, whole[1]))))
    return spans


def _add_peak_rows(model: Model, problem: Problem, fixed: list[int], starts: list[bool]) -> None:
    """P * peak_cap >= M_t + w_t, only where memory can rise: elsewhere the
    row of the step before implies it."""
    ws = workspace(problem)
    cap_units = model.scales.peak_cap / model.scales.bytes
    for t in range(problem.num_steps):
        if t and not starts[t] and fixed[t] + ws[t] - ws[t - 1] <= 0:
            continue
        model.prob += cap_units * model.P - model.M[t] >= ws[t] / model.scales.bytes, f"peak_{t}"
    _add_recompute_scratch_rows(model, problem, ws)


def _add_recompute_scratch_rows(model: Model, problem: Problem, ws: list[int]) -> None:
    """At each step where a recomputed value may start (a segment bound, its read), its op's
    scratch on top of that step's memory while it is alive there (``model.step_workspace``):
    ``P * peak_cap >= M_t + w_v * x``. Only where the scratch exceeds the step's own workspace
    (else ``peak_t`` implies the row)."""
    cap_units, unit = model.scales.peak_cap / model.scales.bytes, model.scales.bytes
    for i, v in enumerate(model.candidates):
        scratch = op_workspace(problem, v)
        if not scratch or v.name not in model.R:
            continue
        starts = model.starts[v.name]
        begins = list(zip(starts.bounds, model.L[v.name]))
        if starts.read is not None:
            begins.append((starts.read, model.R[v.name]))
        for k, (step, x) in enumerate(begins):
            if 0 <= step < problem.num_steps and scratch > ws[step]:
                row = _affine([(model.P, cap_units), (model.M[step], -1.0), (x, -scratch / unit)])
                model.prob += row >= 0, f"scratch_{i}_{k}"


def add_objective(model: Model, objective: Objective) -> None:
    """Minimize one term and break ties with the other, weighted TIE_BREAK.

    time: sum of costs in tau units + P, where P <= 1 and the cheapest
    decision costs 1 / TIE_BREAK units;
    peak: P in memory units + TIE_BREAK * cost / (total cost).

    Solvers prune on absolute objective differences near 1e-6, so the
    tie-break term must be worth far more than that: see FORMULATION.md.
    """
    model.objective = objective
    scales = model.scales
    cost = [(model.R[v.name], v.recompute_seconds) for v in model.candidates if v.name in model.R]
    cost += [(model.S[v.name], v.save_seconds) for v in model.candidates if v.name in model.S]
    cost = [(x, c) for x, c in cost if c > 0]
    if objective == "peak":
        total = sum(c for _, c in cost) or 1.0
        tie = [(x, TIE_BREAK * c / total) for x, c in cost]
        model.prob += _affine([(model.P, scales.peak_cap / scales.bytes), *tie])
        return
    time_terms = [(x, c / scales.seconds) for x, c in cost]
    model.prob += _affine([*time_terms, (model.P, 1.0)])


def _affine(terms: Sequence[tuple[pulp.LpVariable, float]]) -> pulp.LpAffineExpression:
    """The sum of ``terms``; PuLP keeps only the last coefficient of a variable listed twice,
    and tied copies list their shared variables once per copy."""
    total: dict[pulp.LpVariable, float] = {}
    for var, coefficient in terms:
        total[var] = total.get(var, 0.0) + coefficient
    return pulp.LpAffineExpression(list(total.items()))
