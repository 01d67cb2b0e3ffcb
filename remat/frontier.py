"""Budget sweeps (``remat.sweep``): one capture and one profile, a plan at each budget, the frontier.

    frontier = remat.sweep(model, *inputs, points=6)
    frontier.rows                 # plain data, one dict per budget
    frontier.to_pandas(); frontier.plot(); frontier.to_json()
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from remat.passes import torch_adapter as adapter
from remat.passes.decide.attempt import CompileStopped
from remat.passes.decide.graph_plan import GraphPlan, plan_at
from remat.solvers.plan import monotone

from .backend import RematBackend
from .budget import budget_bytes
from .errors import GIB, BudgetError
from .solvers.lazy import Deferred, Deferring
from .measure import held_bytes, step_peak
from .options import Options
from .policies import Policy
from .progress import progress
from .report import Report, report_of

log = logging.getLogger(__name__)


@dataclass
class Frontier(Deferring):
    """Predicted (and, with ``measure=True``, measured) peak and time at each budget.

    ``rows`` is plain data, one dict per budget in the order given: ``budget_gb``,
    ``budget_bytes``, ``feasible``, ``status``, ``predicted_peak_bytes``,
    ``predicted_overhead_seconds``, ``recomputed``, ``kept``, ``solve_seconds``,
    ``mip_gap``, and with ``measure=True`` ``measured_peak_bytes``, ``step_seconds``,
    ``compiled_peak_bytes``, ``plan_budget_bytes`` (the budget whose compiled plan the row
    holds: the fastest measured plan that fits) and ``own_plan_measured_peak_bytes``.
    Infeasible budgets have ``feasible=False`` and no prediction.
    ``min_feasible_bytes`` is computed when first read, as a Report's is.
    """

    rows: list[dict[str, Any]]
    store_all_peak_bytes: int
    min_feasible_bytes: int = Deferred()
    compiler: str
    headroom: float
    device: str = ""
    measured: bool = False
    measured_device: str = ""
    reports: list[Report | None] = field(default_factory=list, repr=False)  # one per row, None when infeasible
    unbinding_budget_bytes: int = 0  # the budget at and above which no plan is bound

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows], "store_all_peak_bytes": self.store_all_peak_bytes,
                "min_feasible_bytes": self.min_feasible_bytes, "compiler": self.compiler, "headroom": self.headroom,
                "unbinding_budget_bytes": self.unbinding_budget_bytes, "device": self.device, "measured": self.measured, "measured_device": self.measured_device}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_pandas(self) -> Any:
        from .render_frontier import frontier_frame

        return frontier_frame(self)

    def to_markdown(self) -> str:
        from .render_frontier import frontier_markdown

        return frontier_markdown(self)

    def plot(self) -> Any:
        """A matplotlib Figure: predicted peak against predicted added time."""
        from .render_frontier import frontier_figure

        return frontier_figure(self)

    def _repr_html_(self) -> str:
        from .render_frontier import frontier_html

        return frontier_html(self)


def sweep(model: Callable[..., Any], *inputs: Any, budgets: Sequence[float] | None = None, points: int = 6,
          solver: str = "ilp", time_limit_s: float = 30.0, profile: str = "measure", compiler: str = "inductor",
          headroom: float | None = None, policy: Policy | str | None = None, checkpoint_regions: str = "recompute",
          budget_scope: str = "auto", measure: bool = False) -> Frontier:
    """Plan ``model(*inputs)`` at several budgets (GiB) and return the frontier.

    The graph is captured and profiled once; each budget is one solve. Without
    ``budgets``, ``points`` budgets spread from the smallest feasible to the one
    at which keeping everything fits. Budgets below the smallest feasible are
    rows with ``feasible=False``. With ``measure=True`` each feasible budget is
    also compiled and one step run (on the model's device, CPU included) for
    its measured peak and step time; this forgets torch.compile's earlier
    graphs in this process and leaves the model's gradients as it found them.
    """
    if budgets is None and (isinstance(points, bool) or not isinstance(points, int) or points < 1):
        raise ValueError(f"points must be a positive whole number, not {points!r}")
    options = Options.pick(locals())
    if budgets is not None:
        for b in budgets:
            replace(options, budget_gb=b)  # refuses malformed budgets before anything runs
    captured = capture(model, inputs, options)
    base = report_of(captured)
    chosen = list(budgets) if budgets is not None else spread(base, points)
    # every budget shares the captured graph's smallest-peak plan (solved once, if a budget
    # needs it) and torch's min-cut figures (computed if a report's are read)
    results = solved_at_each(captured, chosen)
    reports = [r if isinstance(r, Report) else None for r in results]
    rows = [row(gb, r) for gb, r in zip(chosen, results)]
    frontier = Frontier(rows, base.store_all_peak_bytes, 0, compiler, base.headroom, base.device, reports=reports,
                        unbinding_budget_bytes=base.unbinding_budget_bytes)
    frontier.defer(functools.partial(figures, base, ("min_feasible_bytes",)), "min_feasible_bytes")
    if measure:
        measure_frontier(frontier, model, inputs, options)
    if log.isEnabledFor(logging.INFO):  # the table names the smallest feasible budget: computed for the log only
        log.info("remat sweep over %d budgets:\n%s", len(rows), frontier.to_markdown())
    return frontier


def solved_at_each(captured: GraphPlan, budgets_gb: Sequence[float]) -> list[Report | BudgetError]:
    """The captured graph's plan at each budget, as a Report (or the error below the smallest),
    made monotone: each budget gets the fastest plan found at any budget that fits it."""
    plans = [plan_at(captured, budget_bytes(gb)) for gb in progress(budgets_gb, desc="remat: solving", unit="budget")]
    solved = [p for p in plans if isinstance(p, GraphPlan)]
    caps = [p.store_all.peak_bytes if p.target is None else min(p.target, p.store_all.peak_bytes) for p in solved]
    best = dict(zip(map(id, solved), monotone([p.solution for p in solved], caps), strict=True))
    return [p if isinstance(p, BudgetError) else report_of(p.revised(solution=best[id(p)])) for p in plans]


def figures(report: Report, names: Sequence[str]) -> dict[str, Any]:
    """``names`` read from ``report`` (computed there, if pending, once for every reader)."""
    return {name: getattr(report, name) for name in names}


def capture(model: Callable[..., Any], inputs: Sequence[Any], options: Options) -> GraphPlan:
    """Capture and profile the first graph of ``model(*inputs)`` once; nothing runs.

    The plan cache is bypassed: a cached plan carries no profiled problem to solve again.
    """
    backend = RematBackend(replace(options, plan_cache=False), stop_after_plan=True)
    try:
        torch.compile(model, backend=backend)(*inputs)
    except Exception as exc:
        inner = adapter.unwrap_backend_error(exc) or exc
        if not isinstance(inner, CompileStopped):
            raise inner from None
    if not backend.plans:
        raise ValueError("nothing to plan: the model produced no graph that needs a backward "
                         "(do its outputs require grad?)")
    return backend.plans[0]


def spread(report: Report, points: int) -> list[float]:
    """``points`` budgets (GiB) from the smallest feasible to the one at which keeping everything fits."""
    low = report.min_feasible_bytes
    high = max(low, report.unbinding_budget_bytes)
    if points == 1 or high == low:
        return [high / GIB]
    return [(low + i * (high - low) / (points - 1)) / GIB for i in range(points)]


def row(budget_gb: float, result: Report | ValueError) -> dict[str, Any]:
    if isinstance(result, Report):
        return {"budget_gb": budget_gb, "budget_bytes": result.budget_bytes, "feasible": True,
                **plan_fields(result)}
    budget = result.budget_bytes if isinstance(result, BudgetError) else int(budget_gb * GIB)
    return {"budget_gb": budget_gb, "budget_bytes": budget, "feasible": False, "status": "infeasible",
            "predicted_peak_bytes": None, "predicted_overhead_seconds": None, "recomputed": None, "kept": None,
            "solve_seconds": None, "mip_gap": None}


def device_of(model: Any, inputs: Sequence[Any]) -> torch.device:
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    if isinstance(model, torch.nn.Module):
        tensors += list(model.parameters())
    return tensors[0].device if tensors else torch.device("cpu")


@dataclass(frozen=True)
class MeasuredPlan:
    """One budget's compiled plan and its step: the candidates a measured sweep chooses among."""

    budget_bytes: int
    report: Report  # the compiled plan's report, its measured peak in it
    seconds: float

    @property
    def rank(self) -> tuple[float, int, int]:
        """Faster first; then the lower measured peak; then the larger budget (a total order, so
        the budgets a plan wins are nested)."""
        return (self.report.predicted_overhead_seconds, self.report.measured_peak_bytes, -self.budget_bytes)

    def fits(self, budget_bytes: int) -> bool:
        return self.report.measured_peak_bytes <= budget_bytes


def measure_frontier(frontier: Frontier, model: Callable[..., Any], inputs: Sequence[Any], options: Options) -> None:
    """Compile and run one step per feasible budget, then give each budget the fastest plan
    measured at any budget whose measured peak fits it: the measured peak never rises and the
    predicted time never falls as the budget falls."""
    device = device_of(model, inputs)
    frontier.measured, frontier.measured_device = True, str(device)
    fixed = held_bytes(model, inputs)
    grads = [(p, p.grad) for p in model.parameters()] if isinstance(model, torch.nn.Module) else []
    own: dict[int, MeasuredPlan] = {}
    try:
        rows = progress(list(zip(frontier.rows, frontier.reports)), desc="remat: measuring", unit="budget")
        for index, (r, report) in enumerate(rows):
            r["measured_peak_bytes"] = r["step_seconds"] = None
            if report is not None:
                compiled, peak, seconds = measure_step(model, inputs, replace(options, budget_gb=r["budget_gb"]), device)
                own[index] = MeasuredPlan(r["budget_bytes"], compiled.with_measured_peak(peak + fixed), seconds)
    finally:
        for p, grad in grads:
            p.grad = grad
    for index, mine in own.items():
        chosen = fastest_fitting(own.values(), mine)
        frontier.rows[index].update(measured_row(chosen, mine))
        frontier.reports[index] = chosen.report


def fastest_fitting(candidates: Iterable[MeasuredPlan], mine: MeasuredPlan) -> MeasuredPlan:
    """The first-ranked plan whose measured peak fits ``mine``'s budget. A budget whose own plan
    measured over it keeps that plan, so the breach shows in its row."""
    if not mine.fits(mine.budget_bytes):
        log.warning("remat sweep: the plan compiled for %d bytes measured %d", mine.budget_bytes,
                    mine.report.measured_peak_bytes)
        return mine
    return min((c for c in candidates if c.fits(mine.budget_bytes)), key=lambda c: c.rank)


def measured_row(chosen: MeasuredPlan, mine: MeasuredPlan) -> dict[str, Any]:
    """A row's figures for the plan it holds: the compiled plan (which the fitting loop may have
    made tighter than the solve at this budget), its measured peak and step time."""
    r = chosen.report
    return {**plan_fields(r), "compiled_peak_bytes": r.compiled_peak_bytes, "measured_peak_bytes": r.measured_peak_bytes,
            "step_seconds": chosen.seconds, "plan_budget_bytes": chosen.budget_bytes,
            "own_plan_measured_peak_bytes": mine.report.measured_peak_bytes}


def plan_fields(report: Report) -> dict[str, Any]:
    """A row's figures of the plan a report describes (its solve, peak, time and decisions)."""
    return {"status": report.solver_status, "predicted_peak_bytes": report.predicted_peak_bytes,
            "predicted_overhead_seconds": report.predicted_overhead_seconds,
            "recomputed": len(report.recomputed), "kept": len(report.saved),
            "solve_seconds": report.solve_seconds, "mip_gap": report.mip_gap}


def measure_step(model: Callable[..., Any], inputs: Sequence[Any], options: Options,
                 device: torch.device) -> tuple[Report, int, float]:
    """The report of the first graph remat compiled, the step's peak bytes above what was
    allocated before, and its seconds."""
    import remat

    adapter.reset_compiled()  # a fresh capture: dynamo would otherwise reuse an earlier budget's graphs
    compiled = remat.compile(model, **options.kwargs())

    def step() -> None:
        loss = compiled(*inputs)
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"measure=True needs the model to return a tensor (its loss), not {type(loss).__name__}")
        (loss if loss.dim() == 0 else loss.sum()).backward()

    def clear() -> None:
        if isinstance(model, torch.nn.Module):
            model.zero_grad(set_to_none=True)

    step()  # capture, plan, compile
    clear()
    peak = step_peak(step, device)
    clear()
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    seconds = time.perf_counter() - start
    clear()
    return remat.reports(compiled)[0], peak, seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
