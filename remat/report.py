"""Report: one per compiled graph, data first (``to_dict`` / ``to_json``).

Each row's decision, reason and user's names come from :mod:`remat.report_rows`.
Rendering for notebooks (``to_pandas``, ``_repr_html_``, ``plot``) lives in
:mod:`remat.render` and :mod:`remat.render_html` (the card) and imports pandas and
matplotlib only when called.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from dataclasses import asdict, dataclass, field
from typing import Any

from remat import solvers
from remat.solvers.model import copies_kept_bytes as kept_by_copies
from remat.solvers.plan import min_budget_bytes
from remat.solvers.problem import Kind, Problem
from remat.solvers.solution import Solution

from .errors import format_bytes
from .solvers.lazy import Deferred, Deferring
from .report_rows import Context, decision_of, module_spans, op_category, peak_module, user_names

# Timelines stored in a Report keep at most this many points (bucket maxima).
MAX_TIMELINE_POINTS = 2000
# How a summary names the peers' rules scored in the model (Report.peer_rules).
RULE_LABELS = {"checkpoint-blocks": "checkpoint per block", "save-matmuls": "save matmuls"}


@dataclass(frozen=True)
class NodeRow:
    """One node of the joint graph and what the plan does with it, and why."""

    name: str
    op: str
    bytes: int
    flops: float
    seconds: float
    decision: str  # kept | recomputed | freed | input | backward
    reason: str
    category: str = ""  # matmul | attention | pointwise | reduction | view | random | ...
    added_seconds: float = 0.0  # what this decision adds to the step (recompute, or keep when fused)
    workspace: int = 0  # scratch bytes the op holds while it runs, beyond its inputs and outputs
    # the user's names (remat.passes.capture.names): the module that ran the op (``layers.3.attn``; "" for
    # the compiled model's own code or where none was recorded), a graph input's parameter,
    # buffer or argument (``layers.3.attn.q_proj.weight``, ``x``), the source line (``net.py:12``)
    module: str = ""
    input_name: str = ""
    source: str = ""
    label: str = ""  # a short name for people: the input's name, the variable the source line assigns, or the op


@dataclass(repr=False)
class Report(Deferring):
    """What remat planned for one graph, and what it predicts.

    The smallest feasible budget and torch's min-cut figures cost work the plan does not
    need (a smallest-peak solve, compiles under ``remat.plan`` with Inductor, torch's own
    partitioner): they are computed when first read, then kept (``remat.solvers.lazy``).
    ``pending`` names those not computed yet; ``to_dict`` and ``save`` compute them. Rendering
    (``summary``, ``to_pandas``, the card, ``to_html``, ``plot``) never does: it shows such a
    figure as not computed, and how to compute it.

    Rows carry the user's names (``module``, ``input_name``, ``source``, ``label``); the peak
    compared with the budget is ``peak_bytes``, labelled by ``peak_source``.
    """

    budget_bytes: int | None
    predicted_peak_bytes: int
    store_all_peak_bytes: int
    predicted_overhead_seconds: float
    solver: str
    solver_status: str
    solve_seconds: float
    mip_gap: float | None
    nodes: list[NodeRow]
    planned_budget_bytes: int | None = None  # the budget less the headroom
    headroom: float = 0.0  # the fraction held back, when the user set one
    compiled_peak_bytes: int | None = None  # what the program Inductor generated peaks at
    input_bytes: int = 0  # the graph's inputs (parameters, buffers, batch) the budget counts as held
    compile_attempts: int = 0  # plans compiled to fit the budget (Inductor)
    min_feasible_bytes: int = Deferred(0)
    # min_feasible_bytes is the program's (Inductor: the smallest-peak plan compiled) or the model's
    min_feasible_exact: bool = Deferred(False)
    min_cut_peak_bytes: int | None = Deferred(None)
    min_cut_overhead_seconds: float | None = Deferred(None)
    # the peers' own rules as plans of remat's model ("checkpoint-blocks", "save-matmuls"), each
    # {"peak_bytes", "overhead_seconds"}: what checkpointing every block or saving only matmuls
    # would peak at and add under the same model as this plan
    peer_rules: dict[str, dict[str, float]] | None = Deferred(None)
    realized_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None
    profile_seconds: float = 0.0
    # wall seconds of this graph's compile by phase: capture (AOTAutograd's joint graph),
    # profile, solve, inductor (code generation; every plan compiled to fit the budget), program
    # cache (the accepted program put in AOTAutograd's cache); or only "cached program" (loaded whole)
    timings: dict[str, float] = field(default_factory=dict)
    # under torch.distributed: this process's rank and the ranks that share the plan (rank 0's)
    rank: int = 0
    world_size: int = 1
    # what budget_bytes bounds: "step" (the training step as it runs: every peak here is the step's, and
    # these are the bytes counted outside the graph), "rank" (the same, per rank, under FSDP2 or DDP) or
    # "graph" (this graph's own forward+backward, budget_scope="graph")
    budget_scope: str = "graph"
    # the model's state the graph does not read and what torch's tracing keeps for the graph; FSDP's shards
    # and unsharded parameters, DDP's buckets
    resident_bytes: int = 0
    traced_bytes: int = 0  # of resident_bytes: 8-byte scalars torch's tracing keeps, allocated at the first call
    comm_bytes: int = 0  # FSDP's prefetched all-gather and a reduce-scatter input
    eager_bytes: int = 0  # the eager code between forward and backward (a loss, a head), measured on the first step
    eager_reserved: bool = False  # eager_bytes is the reservation made before a first step measured them
    eager_after_bytes: int = 0  # what that eager code leaves alive through the backward (the loss)
    graphs_bytes: int = 0  # other graphs' kept activations and state while this one runs (graph breaks)
    other_state_bytes: int = 0  # parameters of graphs run between its forward and backward (a head compiled apart)
    kept_copies: int = 0  # other modules this graph's plan stands for, each holding its kept values
    copies_kept_bytes: int = 0  # what they hold: their kept values and inputs under this plan
    min_feasible_solve_seconds: float = Deferred(0.0)
    min_cut_seconds: float = Deferred(0.0)  # torch's own partitioner decision, for comparison
    joint_graph_steps: int = 0
    candidates: int = 0
    device: str = ""
    # "stored" when written to the plan cache, "hit" when loaded from it, "program" when its
    # compiled program was loaded too (AOTAutograd's cache: nothing traced or compiled)
    plan_cache: str = ""
    notes: list[str] = field(default_factory=list)
    # Memory over the step (bytes), for ``plot``: point i covers steps
    # timeline_steps[i] up to the next point and holds their maximum.
    timeline_steps: list[int] = field(default_factory=list)
    plan_timeline: list[int] = field(default_factory=list)
    store_all_timeline: list[int] = field(default_factory=list)
    backward_starts_at: int = 0  # the first backward step
    peak_module: str = ""  # the module whose op runs at the plan's predicted peak ("" when unnamed)
    # runs of consecutive steps in one layer or top-level module, (first step, end, module), for ``plot``
    module_spans: list[tuple[int, int, str]] = field(default_factory=list)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_built"):
            raise AttributeError(f"a Report is read-only once built; for a measured peak use "
                                 f"report.with_measured_peak(nbytes), not report.{name} = ...")
        super().__setattr__(name, value)

    def timings_text(self) -> str:
        """Where this graph's compile time went, one phase after another.

        >>> Report(None, 0, 0, 0.0, "ilp", "optimal", 0.0, None, [], timings={"capture": 1.0, "solve": 0.25}).timings_text()
        'capture 1.00 s, solve 0.25 s (total 1.25 s)'
        """
        phases = ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in self.timings.items())
        return f"{phases} (total {sum(self.timings.values()):.2f} s)"

    def with_measured_peak(self, nbytes: int | None) -> Report:
        """This report with a step's measured peak (bytes, as the budget counts it) beside the
        prediction; figures not yet computed stay so, computed for the copy when read."""
        new = self._copy()
        new.__dict__.update(measured_peak_bytes=nbytes, notes=list(self.notes))
        return new

    @property
    def checked_peak_bytes(self) -> int:
        """The peak the budget was checked against: the compiled program's under Inductor,
        the model's op by op (where it is exact)."""
        return self.predicted_peak_bytes if self.compiled_peak_bytes is None else self.compiled_peak_bytes

    @property
    def unbinding_budget_bytes(self) -> int:
        """The budget at and above which no plan is bound: store-all's peak plus what is held back."""
        return min_budget_bytes(self.store_all_peak_bytes, self.headroom)

    def budget_at(self, fraction: float) -> int:
        """The budget ``fraction`` of the way from the smallest feasible (0) to the unbinding one (1)."""
        low = self.min_feasible_bytes
        return int(low + fraction * max(0, self.unbinding_budget_bytes - low))

    @property
    def peak_bytes(self) -> int:
        """The peak compared with the budget: measured where a step was measured, else the
        compiled program's (Inductor), else remat's prediction; ``peak_source`` says which."""
        if self.measured_peak_bytes is not None:
            return self.measured_peak_bytes
        return self.checked_peak_bytes

    @property
    def peak_source(self) -> str:
        """Which peak ``peak_bytes`` is: "measured", "compiled program" or "predicted"."""
        if self.measured_peak_bytes is not None:
            return "measured"
        return "predicted" if self.compiled_peak_bytes is None else "compiled program"

    @property
    def step_seconds(self) -> float:
        """The step's time as profiled op by op, keeping everything (what added time is a share of)."""
        return sum(n.seconds for n in self.nodes)

    def by_module(self) -> list[dict[str, Any]]:
        """The plan's activations grouped by the module that computed them, the most bytes first:
        each ``{"module", "recomputed", "kept", "recomputed_bytes", "kept_bytes"}`` (value labels)."""
        groups: dict[str, dict[str, Any]] = {}
        for n in self.nodes:
            if n.decision not in ("kept", "recomputed") or not n.bytes:
                continue
            group = groups.setdefault(n.module, {"module": n.module, "recomputed": [], "kept": [],
                                                 "recomputed_bytes": 0, "kept_bytes": 0})
            if n.label not in group[n.decision]:
                group[n.decision].append(n.label)
            group[f"{n.decision}_bytes"] += n.bytes
        return sorted(groups.values(), key=lambda g: -(g["recomputed_bytes"] + g["kept_bytes"]))

    @property
    def recomputed(self) -> list[str]:
        return [n.name for n in self.nodes if n.decision == "recomputed"]

    @property
    def saved(self) -> list[str]:
        return [n.name for n in self.nodes if n.decision == "kept"]

    def to_dict(self, *, compute: bool = True) -> dict:
        """Every field as plain data. ``compute=False`` computes nothing: the fields still
        ``pending`` read None (the plan cache stores a report so, with ``pending`` beside it)."""
        if compute:
            return asdict(self)
        pending = self.__dict__.pop("_pending", {})
        try:
            data = asdict(self)  # with nothing pending, reading a field computes nothing
        finally:
            self.__dict__["_pending"] = pending
        return {**data, **dict.fromkeys(pending)}

    def to_json(self, **kwargs: object) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_pandas(self, *, by_module: bool = False) -> Any:
        """One row per node: name, module, label, op, category, bytes, flops, seconds, decision,
        reason, source (needs pandas); ``by_module``: one row per module instead (``by_module()``).
        Computes nothing: figures not computed yet are not in it."""
        from .render import module_frame, report_frame

        return module_frame(self) if by_module else report_frame(self)

    def to_html(self, path: str | os.PathLike[str]) -> pathlib.Path:
        """Write the card (``_repr_html_``) as a page at ``path``; computes nothing. Returns the path."""
        from .render_html import report_page

        out = pathlib.Path(path)
        out.write_text(report_page(self), encoding="utf-8")
        return out

    def save(self, path: str | os.PathLike[str], *, compute: bool = True) -> pathlib.Path:
        """Write ``to_dict(compute=compute)`` as JSON at ``path``. With ``compute`` (the default)
        figures not computed yet are computed first (the smallest feasible budget may compile);
        ``compute=False`` writes them as null and lists them under "pending". Returns the path."""
        data = self.to_dict(compute=compute)
        if not compute:
            data["pending"] = self.pending
        out = pathlib.Path(path)
        out.write_text(json.dumps(data, indent=1), encoding="utf-8")
        return out

    def plot(self) -> Any:
        """A matplotlib Figure: memory over the forward and backward, store-all
        against the plan against the budget, the peak marked (needs matplotlib)."""
        from .render import report_figure

        return report_figure(self)

    def _repr_html_(self) -> str:
        """The notebook card; computes nothing."""
        from .render_html import report_html

        return report_html(self)

    def __repr__(self) -> str:
        return (f"Report(budget={format_bytes(self.budget_bytes)}, predicted_peak={format_bytes(self.predicted_peak_bytes)}, "
                f"store_all_peak={format_bytes(self.store_all_peak_bytes)}, recomputed={len(self.recomputed)}, "
                f"solver={self.solver!r}, status={self.solver_status!r}, nodes={len(self.nodes)})")

    def summary(self) -> str:
        """A few lines for a terminal, the outcome first; computes nothing (a figure not computed
        yet says how to compute it)."""
        from .render import report_text

        return report_text(self)


# --- built from a plan ---------------------------------------------------------


def report_of(plan: Any) -> Report:
    """The Report of one planned graph, built once from the passes' plain record
    (a ``remat.passes.decide.partition.GraphPlan``; read by attribute, so no torch is imported here)."""
    problem, solution, request = plan.problem, plan.solution, plan.request
    names = getattr(plan, "names", {})  # the user's names for the nodes, where the graph was traced
    report = Report(
        budget_bytes=request.budget_bytes,
        predicted_peak_bytes=solution.peak_bytes,
        planned_budget_bytes=plan.target,
        headroom=request.solve.headroom or 0.0,
        input_bytes=sum(v.bytes for v in problem.values if v.kind is Kind.INPUT),
        store_all_peak_bytes=plan.store_all.peak_bytes,
        predicted_overhead_seconds=solution.added_seconds - plan.store_all.added_seconds,
        solver=solution.solver,
        solver_status=str(solution.status.value),
        solve_seconds=solution.solve_seconds,
        mip_gap=solution.gap,
        nodes=node_rows(problem, solution, names),
        peak_module=peak_module(problem, solution, names),
        module_spans=module_spans(problem.step_names, names),
        device=str(problem.meta.get("device", "")),
        joint_graph_steps=problem.num_steps,
        candidates=len(problem.candidates()),
        notes=[*solution.notes, *plan.all_notes],
        compiled_peak_bytes=plan.compiled_peak_bytes,
        compile_attempts=plan.compile_attempts,
        realized_peak_bytes=plan.realized_peak_bytes,
        profile_seconds=plan.profile_seconds,
        timings=dict(plan.timings),
        rank=plan.rank,
        world_size=plan.world_size,
        **scope_fields(plan.scope, problem, solution),
        plan_cache=plan.plan_cache,
        **plan.known(plan.deferred_fields()),  # (a plan's figures are the report's: the same names)
    )
    report.defer_from(plan)  # computed on the plan when first read, once for both
    attach_timelines(report, problem, solution, plan.store_all)
    report.__dict__["_built"] = True  # read-only from here: remat's code never changes it again
    return report


def scope_fields(scope: Any, problem: Problem, solution: Solution) -> dict[str, Any]:
    """The per-rank budget's part of a Report (``remat.passes.scope.rank_scope``), or nothing."""
    if scope is None:
        return {}
    copies = kept_by_copies(problem, solution.saved) + scope.copy_input_bytes
    return {"budget_scope": "step" if scope.process else "rank", "resident_bytes": scope.resident_bytes,
            "comm_bytes": scope.comm_bytes, "eager_bytes": scope.eager_bytes, "eager_reserved": scope.eager_reserved,
            "eager_after_bytes": scope.eager_after_bytes, "graphs_bytes": scope.graphs_bytes,
            "other_state_bytes": scope.other_state_bytes, "kept_copies": scope.copies, "copies_kept_bytes": copies,
            "traced_bytes": scope.traced_bytes}


# --- timelines ---------------------------------------------------------------


def downsample(lines: list[tuple[int, ...]], limit: int = MAX_TIMELINE_POINTS) -> tuple[list[int], list[list[int]]]:
    """Bucket maxima of equally long timelines: (first step of each bucket, lines).

    >>> downsample([(1, 5, 2, 2, 9)], limit=3)
    ([0, 2, 4], [[5, 2, 9]])
    """
    n = len(lines[0]) if lines else 0
    width = max(1, math.ceil(n / limit))
    steps = list(range(0, n, width))
    return steps, [[max(line[s:s + width]) for s in steps] for line in lines]


def attach_timelines(report: Report, problem: Problem, plan: Solution, store_all: Solution | None = None) -> Report:
    """Store the plan's and store-all's memory timelines (downsampled) in ``report``."""
    store_all = store_all if store_all is not None else solvers.store_all(problem)
    steps, (planned, kept) = downsample([plan.timeline, store_all.timeline])
    report.timeline_steps, report.plan_timeline, report.store_all_timeline = steps, planned, kept
    report.backward_starts_at = problem.num_forward_steps
    return report


# --- rows ----------------------------------------------------------------------


def node_rows(problem: Problem, solution: Solution, names: dict[str, Any] | None = None) -> list[NodeRow]:
    """One row per value; ``names``: the user's names by node name (``remat.passes.capture.names.NodeName``)."""
    context = Context.of(problem, solution, names)
    scratch = dict(zip(problem.step_names, problem.workspace))
    names = names or {}
    rows = []
    for v in problem.values:
        decision, reason = decision_of(v, solution, context)
        added = v.recompute_seconds if decision == "recomputed" else v.save_seconds if decision == "kept" else 0.0
        rows.append(NodeRow(v.name, v.op, v.bytes, v.flops, v.seconds, decision, reason,
                            op_category(v, context.by_name), added, scratch.get(v.name, 0),
                            **user_names(v, names.get(v.name))))
    return rows
