"""What the ``remat`` command writes besides a report: compile seconds by phase as a
table (``--timings``), a sweep's seconds split into solving and the rest, and the files
``--out`` asks for (``sweep.json``/``.md``/``.png``, ``fit.json``/``.md``/``.png``).
Nothing here imports torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .frontier import Frontier


def timings_table(timings: dict[str, float]) -> str:
    """Compile seconds by phase, and the total.

    >>> print(timings_table({"capture": 1.5, "inductor": 10.0}))
    phase       seconds
    capture        1.50
    inductor      10.00
    total         11.50
    """
    rows = [*timings.items(), ("total", sum(timings.values()))]
    return "\n".join([f"{'phase':<10}{'seconds':>9}", *(f"{phase:<10}{seconds:>9.2f}" for phase, seconds in rows)])


def sweep_timings(rows: list[dict[str, Any]], seconds: float) -> dict[str, float]:
    """A sweep's ``seconds`` split into its budgets' solves (the rows' ``solve_seconds``) and the rest.

    >>> sweep_timings([{"solve_seconds": 0.5}, {"feasible": False}, {"solve_seconds": 0.25}], 2.0)
    {'solve': 0.75, 'other': 1.25}
    """
    solving = sum(row.get("solve_seconds") or 0.0 for row in rows)
    return {"solve": solving, "other": max(0.0, seconds - solving)}


def write_sweep(frontier: Frontier, out: Path) -> list[str]:
    """sweep.json, sweep.md and (with matplotlib) sweep.png in ``out``: the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(frontier.to_json(indent=2) + "\n")
    (out / "sweep.md").write_text(frontier.to_markdown())
    written = ["sweep.json", "sweep.md"]
    try:
        frontier.plot().savefig(out / "sweep.png", dpi=120)
        written.append("sweep.png")
    except ImportError as exc:
        print(f"remat: no sweep.png: {exc}", file=sys.stderr)
    return [str(out / name) for name in written]


def write_fit(found: Any, out: Path) -> list[str]:
    """fit.json, fit.md and (with matplotlib) fit.png in ``out``: the paths written."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "fit.json").write_text(json.dumps(found.to_dict(), indent=2) + "\n")
    (out / "fit.md").write_text(found.to_markdown() + "\n")
    written = ["fit.json", "fit.md"]
    try:
        found.plot().figure.savefig(out / "fit.png", dpi=120)
        written.append("fit.png")
    except ImportError as exc:
        print(f"remat: no fit.png: {exc}", file=sys.stderr)
    return [str(out / name) for name in written]
