"""Report: one per compiled graph, data first (``to_dict`` / ``to_json``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from remat.solvers.problem import Kind, Problem, Value
from remat.solvers.solution import Solution

from .errors import format_bytes


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


@dataclass(repr=False)
class Report:
    """What remat planned for one graph, and what it predicts."""

    budget_bytes: int | None
    predicted_peak_bytes: int
    min_feasible_bytes: int
    store_all_peak_bytes: int
    predicted_overhead_seconds: float
    solver: str
    solver_status: str
    solve_seconds: float
    mip_gap: float | None
    nodes: list[NodeRow]
    planned_budget_bytes: int | None = None  # the budget less the headroom
    headroom: float = 0.0
    min_cut_peak_bytes: int | None = None
    min_cut_overhead_seconds: float | None = None
    realized_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None
    profile_seconds: float = 0.0
    min_feasible_solve_seconds: float = 0.0
    min_cut_seconds: float = 0.0  # torch's own partitioner decision, for comparison
    joint_graph_steps: int = 0
    candidates: int = 0
    device: str = ""
    plan_cache: str = ""  # "stored" when written to the plan cache, "hit" when loaded from it
    notes: list[str] = field(default_factory=list)

    @property
    def recomputed(self) -> list[str]:
        return [n.name for n in self.nodes if n.decision == "recomputed"]

    @property
    def saved(self) -> list[str]:
        return [n.name for n in self.nodes if n.decision == "kept"]

    def largest_recomputed(self, count: int = 4) -> str:
        """The recomputed values that free the most memory, for a summary line."""
        rows = sorted((n for n in self.nodes if n.decision == "recomputed" and n.bytes), key=lambda n: -n.bytes)
        names = [f"{n.name} ({n.op.removeprefix('aten.')}, {format_bytes(n.bytes)})" for n in rows[:count]]
        return ", ".join(names) + (", ..." if len(rows) > count else "") if names else "none holding memory"

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kwargs: object) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __repr__(self) -> str:
        return (f"Report(budget={format_bytes(self.budget_bytes)}, predicted_peak={format_bytes(self.predicted_peak_bytes)}, "
                f"store_all_peak={format_bytes(self.store_all_peak_bytes)}, recomputed={len(self.recomputed)}, "
                f"solver={self.solver!r}, status={self.solver_status!r}, nodes={len(self.nodes)})")

    def summary(self) -> str:
        """A few lines for a terminal."""
        gib = format_bytes
        lines = [
            f"budget                 {gib(self.budget_bytes)}"
            + (f" (plan fits {gib(self.planned_budget_bytes)}, {self.headroom:.0%} headroom)" if self.headroom and self.budget_bytes else ""),
            f"predicted peak         {gib(self.predicted_peak_bytes)}",
            f"store-all peak         {gib(self.store_all_peak_bytes)}",
            f"smallest feasible      {gib(self.min_feasible_bytes)} (budget)",
        ]
        if self.min_cut_peak_bytes is not None:
            lines.append(f"torch min-cut peak     {gib(self.min_cut_peak_bytes)}")
        if self.measured_peak_bytes is not None:
            lines.append(f"measured peak          {gib(self.measured_peak_bytes)}")
        lines += [
            f"recomputed             {len(self.recomputed)} of {len(self.nodes)} nodes; largest: {self.largest_recomputed()}",
            f"added time (predicted) {self.predicted_overhead_seconds * 1e3:+.3f} ms vs keeping everything",
            f"solver                 {self.solver} ({self.solver_status}, gap {self.mip_gap}) in {self.solve_seconds:.2f} s",
        ]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def decision_of(v: Value, solution: Solution) -> tuple[str, str]:
    if v.kind is Kind.INPUT:
        return "input", "graph input: alive throughout the step"
    if v.kind is Kind.BACKWARD:
        return "backward", "computed in the backward"
    if v.name in solution.saved:
        return "kept", kept_reason(v)
    if v.name in solution.recomputed:
        return "recomputed", recomputed_reason(v)
    return "freed", "freed after its last forward use: the backward never reads it"


def kept_reason(v: Value) -> str:
    if v.recompute_ban:
        return f"kept: {v.recompute_ban}"
    return f"kept: recompute would cost {v.recompute_seconds * 1e3:.3f} ms"


def recomputed_reason(v: Value) -> str:
    if v.bytes == 0:
        return "recomputed: a view, free"
    if v.save_seconds > 0:
        return "recomputed: pointwise, fused into its consumer"
    return f"recomputed: frees {v.bytes / 2**20:.2f} MiB for {v.recompute_seconds * 1e3:.3f} ms"


def node_rows(problem: Problem, solution: Solution) -> list[NodeRow]:
    rows = []
    for v in problem.values:
        decision, reason = decision_of(v, solution)
        rows.append(NodeRow(v.name, v.op, v.bytes, v.flops, v.seconds, decision, reason))
    return rows
