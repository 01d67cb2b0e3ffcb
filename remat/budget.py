"""Budget parsing and the explanation of what bounds the smallest feasible budget."""

from __future__ import annotations

import math
import numbers
from collections import defaultdict

from remat.solvers.problem import Kind, Problem
from remat.solvers.solution import Solution, Status

from .errors import GIB, BudgetError, format_bytes


def budget_bytes(budget_gb: object) -> int | None:
    """GiB (2**30 bytes) -> bytes; ``None`` or ``inf`` mean no limit.

    >>> budget_bytes(1.5)
    1610612736
    >>> budget_bytes(float("inf")) is None
    True
    """
    if budget_gb is None:
        return None
    if isinstance(budget_gb, bool) or not isinstance(budget_gb, numbers.Real):
        raise TypeError(
            f"budget_gb must be a number of GiB (for example budget_gb=20), "
            f"not {type(budget_gb).__name__} {budget_gb!r}"
        )
    value = float(budget_gb)
    if math.isnan(value):
        raise ValueError("budget_gb is NaN; pass a positive number of GiB, or float('inf') for no limit")
    if value <= 0:
        raise ValueError(f"budget_gb must be positive, got {budget_gb}; pass a number of GiB such as 20")
    if math.isinf(value):
        return None
    return int(value * GIB)


def breakdown_at_peak(problem: Problem, solution: Solution) -> dict[str, int]:
    """Bytes alive at the plan's peak step, by category, largest first."""
    step = max(range(len(solution.timeline)), key=solution.timeline.__getitem__)
    parts: dict[str, int] = defaultdict(int)
    for v in problem.values:
        category = alive_category(v, step, solution)
        if category:
            parts[category] += v.bytes
    parts["op workspace"] += problem.workspace_at(step)
    return dict(sorted(((k, b) for k, b in parts.items() if b), key=lambda kv: -kv[1]))


def alive_category(v, step: int, solution: Solution) -> str | None:
    if v.kind is Kind.INPUT:
        return "graph inputs (parameters, buffers, batch)"
    if v.kind is Kind.BACKWARD:
        return "backward values and gradients" if v.produced <= step <= v.last_use else None
    if v.produced <= step <= v.last_use:
        return "forward values in use"
    if v.name in solution.saved and step <= (v.need_end or -1):
        reason = "kept activations that cannot be recomputed" if v.recompute_ban else "kept activations"
        return reason
    if v.name in solution.recomputed and v.need_start is not None and v.need_start <= step <= v.need_end:
        return "recomputed activations"
    return None


def min_budget_bytes(min_peak: int, headroom: float | None, margin: int = 0) -> int:
    """The smallest budget whose planned part fits ``min_peak``: less a ``headroom``
    fraction when one is set, else less ``margin`` bytes."""
    if headroom:
        return math.ceil(min_peak / (1 - headroom))
    return min_peak + margin


def infeasible(problem: Problem, budget: int, min_peak: Solution, headroom: float | None, margin: int) -> BudgetError:
    """The error for ``budget``: a ``headroom`` fraction of it, or else ``margin`` bytes, is held back."""
    parts = breakdown_at_peak(problem, min_peak)
    smallest = min_budget_bytes(min_peak.peak_bytes, headroom, margin)
    if headroom:
        held = f", with {headroom:.0%} held back as headroom"
    else:
        held = f", with {format_bytes(margin)} held back for kernel scratch" if margin else ""
    top = ", ".join(f"{name} {format_bytes(b)}" for name, b in list(parts.items())[:3])
    proven = min_peak.status is Status.OPTIMAL
    which = "the smallest feasible budget" if proven else "the smallest budget found feasible"
    early = "" if proven else (f" The search for the minimum stopped early ({min_peak.status.value}): "
                               f"a longer time_limit_s may find a lower one.")
    return BudgetError(
        f"budget {format_bytes(budget)} is below {which} "
        f"{format_bytes(smallest)} for this graph{held} (at its smallest peak: {top}). "
        f"Raise budget_gb to at least {min_budget_gb(smallest)!r}, "
        f"or shrink the batch or sequence.{early}",
        budget_bytes=budget,
        min_feasible_bytes=smallest,
    )


def min_budget_gb(nbytes: int) -> float:
    """The smallest budget_gb, rounded up to 4 significant digits, that admits ``nbytes``.

    >>> min_budget_gb(2**30 + 1)
    1.001
    """
    gib = nbytes / GIB
    scale = 10 ** (3 - math.floor(math.log10(gib))) if gib > 0 else 1
    return math.ceil(gib * scale) / scale
