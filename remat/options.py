"""Options shared by ``remat.compile``, ``remat.plan``, ``remat.sweep``, the ``remat`` backend and the
``remat`` command: each field declares its command-line flag too (:class:`Flag`), so the one list
below is what every entry point takes."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from remat import solvers
from remat.solvers.plan import Request

from .budget import budget_bytes

if TYPE_CHECKING:  # the passes import torch: this module does not, so that ``remat --help`` is quick
    from remat.passes.modeling.policies import Policy
    from remat.passes.decide.request import PlanRequest

COMPILERS = ("inductor", "eager")
PROFILES = ("measure", "analytic")
CHECKPOINT_REGIONS = ("recompute", "plan")
BUDGET_SCOPES = ("auto", "step", "rank", "graph")


def plan_cache_value(text: str) -> bool | str:
    """A ``--plan-cache`` argument: ``on``, ``off`` or a folder.

    >>> plan_cache_value("off"), plan_cache_value("on"), plan_cache_value("plans/")
    (False, True, 'plans/')
    """
    return {"on": True, "off": False}.get(text, text)


@dataclass(frozen=True)
class Flag:
    """How an option is written on a command line: ``remat plan --budget-gb 4``."""

    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # text -> value; None keeps the text
    choices: tuple[str, ...] = ()

    def arguments(self, default: object) -> dict[str, Any]:
        """``add_argument``'s keywords for this flag, its help ending with ``default``."""
        shown = ("on" if default else "off") if isinstance(default, bool) else default
        text = self.help if default is None else f"{self.help} (default: {shown})"
        keywords: dict[str, Any] = {"help": text.replace("%", "%%")}  # argparse formats help with %
        if self.choices:
            keywords["choices"] = self.choices
        else:
            keywords["metavar"] = self.metavar
        if self.parse is not None:
            keywords["type"] = self.parse
        return keywords


def option(default: Any, flag: Flag) -> Any:
    """A field of :class:`Options` with its default and its command-line flag."""
    return field(default=default, metadata={"flag": flag})


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
      line it runs (see docs/budget.md, Headroom).
    - ``plan_cache``: ``True`` (default) keeps plans on disk, so a graph
      compiled again skips the solve; a folder path keeps them there;
      ``False`` turns it off (see ``remat.passes.cache.plan_cache``). Measured op
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
      forward+backward only (see docs/budget.md).
    """

    budget_gb: float | None = option(None, Flag("peak GiB of a training step; omit for no limit", "GIB", float))
    solver: str = option("ilp", Flag("a solver from remat.solvers.names()", "NAME"))
    time_limit_s: float = option(30.0, Flag("per solve; the best plan found by then is used", "SECONDS", float))
    profile: str = option("measure", Flag("time every op on its device, or estimate from FLOPs and bytes",
                                          choices=PROFILES))
    compiler: str = option("inductor", Flag("eager runs the partitioned graphs op by op, for debugging",
                                            choices=COMPILERS))
    headroom: float | None = option(None, Flag("a fraction of the budget to hold back; omit for none", "FRACTION",
                                               float))
    plan_cache: bool | str | os.PathLike[str] = option(True, Flag("keep plans on disk, in the default folder (on) "
                                                                  "or in DIR, or not (off)", "on|off|DIR",
                                                                  plan_cache_value))
    policy: Policy | str | None = option(None, Flag("pin decisions by a built-in policy (remat.policies), "
                                                    "e.g. save-matmuls", "NAME"))
    checkpoint_regions: str = option("recompute", Flag("regions wrapped in torch.utils.checkpoint: recompute "
                                                       "them as asked, or let remat plan them",
                                                       choices=CHECKPOINT_REGIONS))
    budget_scope: str = option("auto", Flag("what the budget bounds: the training step as it runs, per rank "
                                            "under FSDP2 or DDP (auto, step, rank), or each graph's own step",
                                            choices=BUDGET_SCOPES))

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
        if self.policy is not None:
            from remat.passes.modeling.policies import policy_named

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
        from remat.passes.cache.cost_table import cost_dir
        from remat.passes.cache.plan_cache import cache_dir
        from remat.passes.modeling.policies import policy_named, with_regions
        from remat.passes.decide.request import PlanRequest

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


def flag_of(name: str) -> str:
    """``budget_gb`` -> ``--budget-gb``."""
    return "--" + name.replace("_", "-")


DEST = "option_"  # where add_flags puts each option in the parsed namespace


def add_flags(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """A flag on ``parser`` for each option but ``skip``, defaulting to the option's default.

    >>> parser = argparse.ArgumentParser()
    >>> add_flags(parser, skip=("policy",))
    >>> options = given(parser.parse_args(["--budget-gb", "0.5", "--plan-cache", "off"]))
    >>> options["budget_gb"], options["plan_cache"], options["solver"], "policy" in options
    (0.5, False, 'ilp', False)
    """
    for spec in dataclasses.fields(Options):
        if spec.name not in skip:
            parser.add_argument(flag_of(spec.name), dest=DEST + spec.name, default=spec.default,
                                **spec.metadata["flag"].arguments(spec.default))


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The options of a namespace ``add_flags`` parsed (each flag's value or its default), by name."""
    return {key[len(DEST):]: value for key, value in vars(args).items() if key.startswith(DEST)}
