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
from remat.solvers.errors import GraphError
from remat.passes.eager_compiler import compile_eager
from remat.passes import eager_parts, plan_cache, program_cache, rank_scope, ranks
from remat.passes.devices import cpu_spec, planned_for
from remat.passes.torch_adapter.meta_capture import captured_as_on, is_meta
from remat.passes.fit import compile_fitted, compile_given, defer_min_feasible
from remat.passes.partition import GraphPlan, PlanComplete, Planner

from .options import Options
from .report import Report, report_of

# Backends made for ``backend="remat"`` by name, in order: ``remat.reports()`` reads them.
_NAMED_BACKENDS: list[RematBackend] = []


class RematBackend:
    """A torch.compile backend that plans each graph under ``options``."""

    def __init__(self, options: Options, *, stop_after_plan: bool = False,
                 loss_fn: Callable[[Any], Any] | None = None) -> None:
        self.options = options
        self.stop_after_plan = stop_after_plan
        self.loss_fn = loss_fn  # remat.plan(..., loss_fn=): the eager code after the graph, measured before planning
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
        try:
            if is_meta(example_inputs):  # traced as on the device planned for (passes/torch_adapter/meta_capture.py)
                with captured_as_on((planned_for() or cpu_spec()).kind):
                    return self.compile_graph(gm, example_inputs)
            return self.compile_graph(gm, example_inputs)
        except BaseException:
            eager_parts.abandon_open_windows()  # the step stops here: no backward will end them
            raise

    def compile_graph(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        if self.options.budget_gb is not None and adapter.compiling_ddp_bucket():
            raise GraphError(
                "under a budget remat compiles a DDP model as one graph: torch.compile splits it at DDP's "
                "gradient buckets (dynamo's DDP optimizer), and each piece would get the whole budget while "
                "the others' activations stay alive, so the rank's step would exceed it. Set "
                "torch._dynamo.config.optimize_ddp = False before compiling (DDP still overlaps its "
                "allreduces with the backward), or drop budget_gb.")
        if self.loss_fn is not None and self.planner.request.budget_scope != "graph":
            eager_parts.remember_measured(gm, eager_parts.measure_loss(self.loss_fn, gm))
        # what the rank holds outside this graph, when the budget is the rank's (read before
        # any exchange: every rank reads its own FSDP or DDP state)
        self.planner.scope = rank_scope.scope_of(gm, example_inputs, self.planner.request.budget_scope)
        # the module's state the graph does not read is held all the same (a rank scope counts it already)
        self.planner.unread_state = 0 if self.planner.scope else rank_scope.unread_state_bytes(example_inputs)
        planned = len(self.planner.plans)
        compiled = self.agreed(gm, example_inputs)
        if self.planner.scope is None or len(self.planner.plans) == planned or self.stop_after_plan:
            return compiled
        plan = self.planner.plans[-1]
        # the eager code around the graph (head, loss) is measured on the first step, counted from the next
        return eager_parts.EagerWatch(compiled, plan, lambda eager: self.replanned(gm, example_inputs, plan, eager),
                                      lambda eager: self.recounted(plan, eager), rank_scope.state_storages(example_inputs))

    def agreed(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """Plan and compile the graph as every rank agrees: rank 0 decides, the others follow."""
        agreement = ranks.Agreement.for_graph(gm.graph, self.planner.request)
        if agreement is not None and not agreement.decides:
            return self.follow(gm, example_inputs, agreement)
        planned = len(self.planner.plans)
        # read before remat's compile turns AOTAutograd's cache off
        programs = not self.stop_after_plan and program_cache.usable(self.planner, example_inputs)
        try:
            compiled = self.compile(gm, example_inputs, programs=programs)
        except PlanComplete:
            self.tell(agreement, planned)
            raise
        except Exception as exc:
            if agreement is not None:  # the other ranks raise it too, instead of waiting
                agreement.send_error(exc)
            raise
        self.tell(agreement, planned)
        return compiled

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence[Any], *, given: bool = False,
                programs: bool = False) -> Callable[..., Any]:
        """Plan and compile one captured graph; ``given``: with the plan the planner was handed;
        ``programs``: load and publish whole programs (``passes/program_cache.py``)."""
        self.planner.capture_started = time.perf_counter()
        self.planner.input_names = self.planner.names_of_inputs(gm)  # the report's parameter names
        planned = len(self.planner.plans)
        with adapter.saved_values_chooser(self.planner.choose):
            if self.options.compiler == "eager" or is_meta(example_inputs):
                # on meta nothing can run, Inductor's code generation included: the plan is the
                # FX-level model's (the problem still assumes Inductor's fusion when it compiles)
                self.planner.stop_after_plan = self.stop_after_plan
                return compile_eager(gm, example_inputs, on_graph=self.planner.on_graph)
            # what the plan depends on, known before tracing: where a whole program is stored
            key = program_cache.program_key(gm, example_inputs, self.planner) if programs else None
            loaded = None if key is None else program_cache.load(gm, example_inputs, self.planner,
                                                                 adapter.compile_inductor, key)
            if loaded is not None:
                return loaded
            # Inductor: compile, account for the program it generated, plan tighter while it is over
            # (rank 0 did that for a given plan: it is compiled as it is)
            fitted = compile_given if given else compile_fitted
            self.planner.record_programs = programs
            try:
                compiled = fitted(gm, example_inputs, self.planner, adapter.compile_inductor)
            finally:
                self.planner.record_programs = False
            if len(self.planner.plans) == planned:  # an inference graph (no grad): nothing planned
                return compiled
            if self.stop_after_plan:  # remat.plan: its smallest feasible budget is the compiled one
                defer_min_feasible(gm, example_inputs, self.planner, adapter.compile_inductor)
                raise PlanComplete
            if key is not None:  # the next process loads this plan's program whole
                return program_cache.publish(gm, example_inputs, self.planner, adapter.compile_inductor, compiled, key)
            return compiled

    def replanned(self, gm: fx.GraphModule, example_inputs: Sequence[Any], plan: GraphPlan,
                  eager: eager_parts.EagerParts) -> Callable[..., Any]:
        """``plan``'s graph planned and compiled again with ``eager`` parts counted; the new plan takes
        the old one's place among the reports."""
        self.planner.scope = eager_parts.with_eager(plan.scope, eager)
        eager_parts.remember(self.planner.scope)
        index = self.planner.plans.index(plan)
        compiled = self.agreed(gm, example_inputs)
        self.planner.plans.remove(plan)
        self.planner.plans.insert(index, self.planner.plans.pop())
        self.built.pop(plan, None)
        return compiled

    def recounted(self, plan: GraphPlan, eager: eager_parts.EagerParts) -> None:
        """``plan`` still fits with ``eager`` parts: its figures count them."""
        eager_parts.raised_by(plan, eager, self.planner.lowest_of)
        self.built.pop(plan, None)

    def tell(self, agreement: ranks.Agreement | None, planned: int) -> None:
        """Rank 0: send the plan it compiled for the graph (None when it planned none)."""
        if agreement is not None:
            plan = self.planner.plans[-1] if len(self.planner.plans) > planned else None
            record = None if plan is None else plan_cache.record_of(plan_cache.entry_of(plan))
            agreement.send(record, [] if plan is None else plan.node_order)

    def follow(self, gm: fx.GraphModule, example_inputs: Sequence[Any], agreement: ranks.Agreement) -> Callable[..., Any]:
        """A rank other than 0: compile rank 0's plan for the graph, or raise rank 0's error."""
        t0 = time.perf_counter()
        self.planner.given = agreement.receive()
        waited = time.perf_counter() - t0
        planned = len(self.planner.plans)
        try:
            return self.compile(gm, example_inputs, given=self.planner.given is not None)
        finally:
            self.planner.given = None
            if len(self.planner.plans) > planned:
                self.planner.plans[-1].timings["agree"] = waited


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
