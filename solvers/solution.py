"""What every solver returns: one plan plus the facts needed to trust it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    """How much a Solution promises about its added time."""

    OPTIMAL = "optimal"  # proven optimal within the configured MIP gap
    FEASIBLE = "feasible"  # time limit hit with a feasible plan; see bound/gap
    HEURISTIC = "heuristic"  # a baseline: valid plan, no optimality claim
    FALLBACK = "fallback"  # the solver failed; a cheap valid plan instead


@dataclass(frozen=True)
class Solution:
    """A keep/recompute plan evaluated under the model of ``simulate``.

    ``peak_bytes``, ``timeline`` and ``added_seconds`` always come from
    ``simulate.evaluate``, never from solver floats. ``bound`` is the best
    proven lower bound of the solver's objective (seconds when minimizing
    time, bytes when minimizing peak), ``gap`` the relative MIP gap. With
    ``shared_blocks`` > 0 the program gave that many identical blocks one set of
    decisions (``blocks.py``): ``bound``, ``gap`` and an OPTIMAL status hold within
    plans that share them, not among every plan. With ``fixed_decisions`` > 0 that many
    decisions of identical blocks were fixed where near plans agree (``near.py``): the same holds
    among plans that take them.
    """

    solver: str
    saved: frozenset[str]
    recomputed: frozenset[str]
    peak_bytes: int
    timeline: tuple[int, ...]
    added_seconds: float
    status: Status
    bound: float | None
    gap: float | None
    solve_seconds: float
    notes: tuple[str, ...] = ()
    shared_blocks: int = 0
    fixed_decisions: int = 0

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready data; sets become sorted lists."""
        return {
            "solver": self.solver,
            "saved": sorted(self.saved),
            "recomputed": sorted(self.recomputed),
            "peak_bytes": self.peak_bytes,
            "timeline": list(self.timeline),
            "added_seconds": self.added_seconds,
            "status": self.status.value,
            "bound": self.bound,
            "gap": self.gap,
            "solve_seconds": self.solve_seconds,
            "notes": list(self.notes),
            "shared_blocks": self.shared_blocks,
            "fixed_decisions": self.fixed_decisions,
        }
