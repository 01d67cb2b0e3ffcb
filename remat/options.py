"""Options shared by ``remat.compile``, ``remat.plan`` and the ``remat`` backend."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from remat import solvers
from remat.passes.cost_table import cost_dir
from remat.passes.plan_cache import cache_dir
from remat.passes.policies import Policy, policy_named, with_regions
from remat.passes.request import PlanRequest
from remat.solvers.plan import Request

from .budget import budget_bytes

COMPILERS = ("inductor", "eager")
PROFILES = ("measure", "analytic")
CHECKPOINT_REGIONS = ("recompute", "plan")
BUDGET_SCOPES = ("auto", "step", "rank", "graph")


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
      ``False`` turns it off (see ``remat.passes.plan_cache``). Measured op
      costs are kept beside the plans (``costs/`` in that folder, or where
      ``REMAT_COST_CACHE`` says), so a later process measures no op twice.
    - ``policy``: decisions to pin before the solve (``remat.policies``: a
      :class:`~remat.policies.Policy`, or a built-in one's name such as
      ``"save-matmuls"``); the ILP decides the rest. ``None``: the ILP decides all
      (random ops, mutations and untagged collectives are always kept).
    - ``checkpoint_regions``: what to do with regions the model wraps in
      ``torch.utils.checkpoint``: "recompute" (default) recomputes them as
      asked, as torch does, and reports say so; "plan" lets remat decide
      inside them too, as for the rest of the graph. Selective-checkpoint
      tags (``MUST_SAVE``/``MUST_RECOMPUTE``) bind either way.
    - ``budget_scope``: what ``budget_gb`` bounds. "auto" (default), "step" or
      "rank": the training step as it runs, per rank: the eager code after the
      graph (a loss computed outside the model; reserved before the first step,
      measured on it, counted from the next), the module's state the graph does
      not read, and under FSDP2 or DDP the rank's local shards, FSDP's unsharded
      parameters and communication buffers, DDP's buckets and every copy of a
      compiled block's kept activations; "graph": each compiled graph's own
      forward+backward only (see the README, What the budget means).
    """

    budget_gb: float | None = None
    solver: str = "ilp"
    time_limit_s: float = 30.0
    profile: str = "measure"
    compiler: str = "inductor"
    headroom: float | None = None
    plan_cache: bool | str | os.PathLike[str] = True
    policy: Policy | str | None = None
    checkpoint_regions: str = "recompute"
    budget_scope: str = "auto"

    def __post_init__(self) -> None:
        if self.headroom is not None and not (isinstance(self.headroom, (int, float)) and 0 <= self.headroom < 1):
            raise ValueError(f"headroom must be a fraction in [0, 1), not {self.headroom!r}")
        budget_bytes(self.budget_gb)  # validates
        if self.checkpoint_regions not in CHECKPOINT_REGIONS:
            raise ValueError(f"checkpoint_regions must be one of {CHECKPOINT_REGIONS}, not {self.checkpoint_regions!r}")
        if self.budget_scope not in BUDGET_SCOPES:
            raise ValueError(f"budget_scope must be one of {BUDGET_SCOPES}, not {self.budget_scope!r}")
        if self.compiler not in COMPILERS:
            raise ValueError(f"compiler must be one of {COMPILERS}, not {self.compiler!r}")
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}, not {self.profile!r}")
        if not isinstance(self.time_limit_s, (int, float)) or not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be a positive number of seconds, not {self.time_limit_s!r}")
        if not isinstance(self.plan_cache, (bool, str, os.PathLike)):
            raise ValueError(f"plan_cache must be True, False or a folder path, not {self.plan_cache!r}")
        solvers.get(self.solver)  # an unknown or uninstalled solver is named now, not at the first call
        policy_named(self.policy)  # validates

    @property
    def budget_bytes(self) -> int | None:
        return budget_bytes(self.budget_gb)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in order: the one list ``compile``, ``plan``, ``sweep`` and the CLI take."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def pick(cls, arguments: Mapping[str, object]) -> Options:
        """The Options among ``arguments`` (a function's ``locals()``): its other names ignored."""
        return cls(**{name: arguments[name] for name in cls.names() if name in arguments})  # type: ignore[arg-type]

    def kwargs(self) -> dict[str, object]:
        """Every option by name, to pass on (``remat.compile(model, **options.kwargs())``)."""
        return {name: getattr(self, name) for name in self.names()}

    def request(self) -> PlanRequest:
        """The plain request the passes plan from."""
        solve = Request(self.budget_bytes, self.headroom, self.solver, self.time_limit_s)
        plans = cache_dir(self.plan_cache)
        policy = with_regions(policy_named(self.policy), self.checkpoint_regions)
        return PlanRequest(solve, self.profile, self.compiler, plans, policy, cost_dir(plans), self.checkpoint_regions,
                           self.budget_scope)

    @classmethod
    def from_mapping(cls, options: Mapping[str, object] | None) -> Options:
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown remat option(s) {unknown}; known options: {sorted(known)}")
        return cls(**options)  # type: ignore[arg-type]
