"""The ``remat`` torch.compile backend.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="remat", options={"budget_gb": 20})`` works
after ``pip install`` without ``import remat``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

from remat.passes import torch_adapter as adapter
from remat.solvers.errors import GraphError
from remat.passes.program.eager_compiler import compile_eager
from remat.passes.scope import eager_parts, rank_scope, ranks
from remat.passes.cache import plan_cache, program_cache
from remat.passes.devices import planned_device, program_accounted
from remat.passes.torch_adapter.meta_capture import captured_as_on, is_meta, on_fake_device
from remat.passes.decide.attempt import Attempt, CompileStopped, GraphSetting, compile_attempt
from remat.passes.program.fit import Fitted, compile_fitted, compile_given, with_compiled_min_feasible
from remat.passes.decide.graph_plan import GraphPlan
from remat.passes.program.known_programs import identity
from remat.passes.capture.names import names_of_inputs
from remat.passes.decide.partition import Planner

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
        self.planner = Planner(options.request())
        self.plans: list[GraphPlan] = []  # each captured graph's plan, in the order they were compiled
        self.built: dict[GraphPlan, Report] = {}
        self.__name__ = "remat"

    @property
    def reports(self) -> list[Report]:
        """One Report per planned graph, built once the graph's plan is complete."""
        return [self.report(plan) for plan in self.plans]

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
                with captured_as_on(planned_device().kind):
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
        scope = rank_scope.scope_of(gm, example_inputs, self.planner.request.budget_scope)
        # the module's state the graph does not read is held all the same (a rank scope counts it already)
        setting = GraphSetting(scope=scope, unread_state=0 if scope else rank_scope.unread_state_bytes(example_inputs),
                               input_names=names_of_inputs(gm))  # the report's parameter names
        try:
            compiled, plan = self.agreed(gm, example_inputs, setting)
        except CompileStopped as stopped:  # remat.plan: the graph planned, nothing run
            if stopped.plan is not None:
                self.plans.append(stopped.plan)
            raise
        if plan is not None:
            self.plans.append(plan)
        if scope is None or plan is None or self.stop_after_plan:
            return compiled
        # the eager code around the graph (head, loss) is measured on the first step, counted from the next
        return eager_parts.EagerWatch(compiled, plan,
                                      lambda now, eager: self.replanned(gm, example_inputs, setting, now, eager),
                                      lambda now, eager: eager_parts.raised_by(now, eager, self.planner.lowest_of),
                                      self.superseded,
                                      rank_scope.state_storages(gm, example_inputs))

    def agreed(self, gm: fx.GraphModule, example_inputs: Sequence[Any], setting: GraphSetting) -> Fitted:
        """Plan and compile the graph as every rank agrees: rank 0 decides, the others follow."""
        agreement = ranks.Agreement.for_graph(gm.graph, self.planner.request)
        if agreement is not None and not agreement.decides:
            return self.follow(gm, example_inputs, setting, agreement)
        # read before remat's compile turns AOTAutograd's cache off
        programs = not self.stop_after_plan and program_cache.usable(self.planner, setting, example_inputs)
        setting = dataclasses.replace(setting, record_programs=programs)
        try:
            compiled, plan = self.compile(gm, example_inputs, setting)
        except CompileStopped as stopped:  # remat.plan: planned, nothing compiled further
            self.tell(agreement, stopped.plan)
            raise
        except Exception as exc:
            if agreement is not None:  # the other ranks raise it too, instead of waiting
                agreement.send_error(exc)
            raise
        self.tell(agreement, plan)
        return compiled, plan

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence[Any], setting: GraphSetting) -> Fitted:
        """Plan and compile one captured graph (with the plan rank 0 gave, where ``setting`` has one);
        ``setting.record_programs``: load and publish whole programs (``passes/cache/program_cache.py``)."""
        if is_meta(example_inputs) and self.stop_after_plan and program_accounted(self.options.compiler,
                                                                                    planned_device()):
            # planning only: the device's program is generated for fake inputs (nothing allocated or
            # run) and accounted for; a program that is to run on meta inputs cannot be the device's
            gm, example_inputs = on_fake_device(gm, example_inputs, planned_device().kind)
        if self.options.compiler == "eager" or is_meta(example_inputs):
            # on meta for a device whose program cannot be generated here: the plan is the
            # FX-level model's (the problem still assumes Inductor's fusion when it compiles)
            attempt = Attempt(setting, stop_after_plan=self.stop_after_plan)
            try:
                return compile_attempt(gm, example_inputs, self.planner, attempt, compile_eager), attempt.plan
            except CompileStopped as stopped:
                raise stopped.with_plan(attempt.plan)
        # what the plan depends on, known before tracing: where a whole program is stored
        key = program_cache.program_key(gm, example_inputs, self.planner, setting) if setting.record_programs else None
        loaded = None if key is None else program_cache.load(gm, example_inputs, self.planner, setting,
                                                             adapter.compile_inductor, key)
        if loaded is not None:
            return loaded
        # Inductor: compile, account for the program it generated, plan tighter while it is over
        # (rank 0 did that for a given plan: it is compiled as it is)
        fitted = compile_given if setting.given is not None else compile_fitted
        # what the graph's programs follow from besides their plans (read before remat's Inductor settings)
        setting = dataclasses.replace(setting, program=identity(gm, example_inputs))
        compiled, plan = fitted(gm, example_inputs, self.planner, setting, adapter.compile_inductor)
        if plan is None:  # an inference graph (no grad): nothing planned
            return compiled, None
        if self.stop_after_plan:  # remat.plan: its smallest feasible budget is the compiled one
            plan = with_compiled_min_feasible(gm, example_inputs, self.planner, setting, adapter.compile_inductor, plan)
            raise CompileStopped("planned").with_plan(plan)
        if key is not None:  # the next process loads this plan's program whole
            compiled, plan = program_cache.publish(gm, example_inputs, self.planner, setting,
                                                   adapter.compile_inductor, compiled, plan, key)
        return compiled, plan

    def replanned(self, gm: fx.GraphModule, example_inputs: Sequence[Any], setting: GraphSetting, plan: GraphPlan,
                  eager: eager_parts.EagerParts) -> Fitted:
        """``plan``'s graph planned and compiled again with ``eager`` parts counted."""
        scope = plan.scope.with_eager(eager)
        eager_parts.remember(scope)
        return self.agreed(gm, example_inputs, dataclasses.replace(setting, scope=scope))

    def superseded(self, plan: GraphPlan, new: GraphPlan) -> None:
        """``new`` takes ``plan``'s place among the reports (what the first step measured counted)."""
        self.plans[self.plans.index(plan)] = new
        self.built.pop(plan, None)

    def tell(self, agreement: ranks.Agreement | None, plan: GraphPlan | None) -> None:
        """Rank 0: send the plan it compiled for the graph (None when it planned none)."""
        if agreement is not None:
            record = None if plan is None else plan_cache.record_of(plan_cache.entry_of(plan))
            agreement.send(record, [] if plan is None else plan.node_order)

    def follow(self, gm: fx.GraphModule, example_inputs: Sequence[Any], setting: GraphSetting,
               agreement: ranks.Agreement) -> Fitted:
        """A rank other than 0: compile rank 0's plan for the graph, or raise rank 0's error."""
        t0 = time.perf_counter()
        given = agreement.receive()
        waited = time.perf_counter() - t0
        compiled, plan = self.compile(gm, example_inputs, dataclasses.replace(setting, given=given))
        return compiled, None if plan is None else plan.timed("agree", waited)


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
