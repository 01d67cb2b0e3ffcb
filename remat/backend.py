"""The ``remat`` torch.compile backend.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="remat", options={"budget_gb": 20})`` works
after ``pip install`` without ``import remat``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

from remat.passes import torch_adapter as adapter
from remat.passes.eager_compiler import compile_eager
from remat.passes.fit import compile_fitted, defer_min_feasible
from remat.passes.partition import GraphPlan, PlanComplete, Planner

from .options import Options
from .report import Report, report_of

# Backends made for ``backend="remat"`` by name, in order: ``remat.reports()`` reads them.
_NAMED_BACKENDS: list[RematBackend] = []


class RematBackend:
    """A torch.compile backend that plans each graph under ``options``."""

    def __init__(self, options: Options, *, stop_after_plan: bool = False) -> None:
        self.options = options
        self.stop_after_plan = stop_after_plan
        # Op by op the model is exact: planning is enough. Under Inductor a plan is
        # compiled (nothing runs) so that its program is known; then capture stops.
        self.planner = Planner(options.request(), stop_after_plan=stop_after_plan and options.compiler == "eager")
        self.built: dict[GraphPlan, Report] = {}
        self.__name__ = "remat"

    @property
    def reports(self) -> list[Report]:
        """One Report per planned graph, built once the graph's plan is complete."""
        return [self.report(plan) for plan in self.planner.plans]

    def report(self, plan: GraphPlan) -> Report:
        if plan in self.built:
            return self.built[plan]
        report = report_of(plan)
        if plan.complete or self.stop_after_plan:  # nothing the passes learn changes it any more
            self.built[plan] = report
        return report

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        self.planner.capture_started = time.perf_counter()
        with adapter.saved_values_chooser(self.planner.choose):
            if self.options.compiler == "eager":
                return compile_eager(gm, example_inputs, on_graph=self.planner.on_graph)
            # Inductor: compile, account for the program it generated, plan tighter while it is over
            compiled = compile_fitted(gm, example_inputs, self.planner, adapter.compile_inductor)
            if self.stop_after_plan:  # remat.plan: its smallest feasible budget is the compiled one
                defer_min_feasible(gm, example_inputs, self.planner, adapter.compile_inductor)
                raise PlanComplete
            return compiled


def remat_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None,
                  mode: str | None = None) -> Callable[..., Any]:
    """Entry point for ``backend="remat"``; ``options`` as :class:`remat.Options`."""
    if mode not in (None, "default"):
        raise ValueError(f"backend='remat' takes no mode (got {mode!r}); pass options={{'budget_gb': ...}}")
    backend = RematBackend(Options.from_mapping(options))
    compiled = backend(gm, example_inputs)
    _NAMED_BACKENDS.append(backend)
    return compiled


def named_reports() -> list[Report]:
    """Reports of every graph compiled through ``backend="remat"`` in this process, in order."""
    return [report for backend in _NAMED_BACKENDS for report in backend.reports]


def register() -> None:
    """Make ``backend="remat"`` known to dynamo in this process (idempotent)."""
    adapter.register_backend("remat", remat_backend)
