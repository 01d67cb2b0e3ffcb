"""Budget parsing. What bounds the smallest feasible budget, and the error below it,
belong to the solve policy (``remat.solvers.plan``)."""

from __future__ import annotations

import math
import numbers

from remat.solvers.plan import min_budget_bytes, min_budget_gb

from .errors import GIB

__all__ = ["budget_bytes", "min_budget_bytes", "min_budget_gb"]


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
