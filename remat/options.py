"""Options shared by ``remat.compile``, ``remat.plan`` and the ``remat`` backend."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from remat import solvers

from .budget import budget_bytes

COMPILERS = ("inductor", "eager")
PROFILES = ("measure", "analytic")


@dataclass(frozen=True)
class Options:
    """How to plan and compile.

    - ``budget_gb``: peak GiB of one forward+backward of each compiled graph
      (inputs, kept activations, temporaries, workspace, gradients);
      ``None`` or ``inf``: no limit, the fastest plan.
    - ``solver``: a name from ``remat.solvers.names()`` ("ilp" by default).
    - ``time_limit_s``: per solve; the best feasible plan found is used.
    - ``profile``: "measure" (time every op on its device) or "analytic"
      (FLOPs and bytes over device peaks, nothing run).
    - ``compiler``: "inductor" (default) or "eager" (run the partitioned
      graphs op by op: no fusion, for debugging).
    - ``headroom``: a fraction of the budget to hold back; ``None`` (default)
      holds back nothing: op by op ("eager") the model predicts the step to
      the byte, and under "inductor" remat accounts for the program Inductor
      generated, line by line, each extern kernel's measured scratch at the
      line it runs (see the README, Headroom).
    - ``plan_cache``: ``True`` (default) keeps plans on disk, so a graph
      compiled again skips the solve; a folder path keeps them there;
      ``False`` turns it off (see ``remat.passes.plan_cache``).
    """

    budget_gb: float | None = None
    solver: str = "ilp"
    time_limit_s: float = 30.0
    profile: str = "measure"
    compiler: str = "inductor"
    headroom: float | None = None
    plan_cache: bool | str | os.PathLike[str] = True

    def __post_init__(self) -> None:
        if self.headroom is not None and not (isinstance(self.headroom, (int, float)) and 0 <= self.headroom < 1):
            raise ValueError(f"headroom must be a fraction in [0, 1), not {self.headroom!r}")
        budget_bytes(self.budget_gb)  # validates
        if self.compiler not in COMPILERS:
            raise ValueError(f"compiler must be one of {COMPILERS}, not {self.compiler!r}")
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}, not {self.profile!r}")
        if not isinstance(self.time_limit_s, (int, float)) or not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be a positive number of seconds, not {self.time_limit_s!r}")
        if not isinstance(self.plan_cache, (bool, str, os.PathLike)):
            raise ValueError(f"plan_cache must be True, False or a folder path, not {self.plan_cache!r}")
        solvers.get(self.solver)  # an unknown or uninstalled solver is named now, not at the first call

    @property
    def budget_bytes(self) -> int | None:
        return budget_bytes(self.budget_gb)

    @classmethod
    def from_mapping(cls, options: Mapping[str, object] | None) -> Options:
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown remat option(s) {unknown}; known options: {sorted(known)}")
        return cls(**options)  # type: ignore[arg-type]
