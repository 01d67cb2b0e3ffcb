"""What the user-facing layer asks of the passes: plain data (remat's ``Options`` builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from remat.solvers.plan import Request

from ..modeling.policies import Policy


@dataclass(frozen=True)
class PlanRequest:
    """How to plan and compile one model's graphs.

    - ``solve``: the budget, headroom, solver and time limit (:class:`remat.solvers.plan.Request`).
    - ``profile``: "measure" (time every op on its device) or "analytic".
    - ``compiler``: "inductor" or "eager" (the partitioned graphs run op by op).
    - ``plan_cache``: the folder plans are kept in, or ``None`` (off).
    - ``cost_cache``: the folder of the measured op cost table (``passes/cache/cost_table.py``), or ``None``.
    - ``policy``: decisions pinned before the solve (``remat.policies``), or ``None``.
    - ``checkpoint_regions``: "recompute" (the policy already pins them) or "plan".
    - ``budget_scope``: "auto", "rank" or "graph" (``passes/scope/rank_scope.py``).
    """

    solve: Request = field(default_factory=Request)
    profile: str = "measure"
    compiler: str = "inductor"
    plan_cache: Path | None = None
    policy: Policy | None = None
    cost_cache: Path | None = None
    checkpoint_regions: str = "recompute"  # or "plan": remat decides inside torch.utils.checkpoint regions
    budget_scope: str = "auto"

    @property
    def budget_bytes(self) -> int | None:
        return self.solve.budget_bytes
