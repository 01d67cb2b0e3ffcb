"""One model, every peer and remat, measured in one run: peak memory against step time.

Rows, in order: each PyTorch peer (:mod:`bench.peers`); remat with no budget;
remat at each peer's measured peak (equal memory); remat's own sweep from its
smallest feasible budget to store-all. Per row: the peak under the budget
contract (max allocated during the step - allocated before it + the graph's
inputs; on CUDA also the allocator's reserved peak), the step time (median of
``steps`` steps after ``warmup`` warm-up steps, CUDA events on GPU), the
compile time, and for remat its budget, prediction and solve time.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import remat
from bench.peers import Peer
from remat.errors import GIB, BudgetError
from remat.measure import budget_peak
from remat.passes import torch_adapter as adapter
from remat.passes.costs.timing import seconds_of_call

log = logging.getLogger(__name__)
SWEEP = (0.0, 0.25, 0.5, 0.75)  # of the way from remat's smallest feasible budget to store-all
SHARE = 0.01  # peers whose peaks are within 1 % share one remat measurement (the lower budget)


@dataclass(frozen=True)
class Setup:
    """How one model's rows are run."""

    device: str
    backend: str = "inductor"  # torch.compile's backend for the peers
    compiler: str = "inductor"  # remat's
    headroom: float | None = None  # remat's headroom; None: its default for the compiler
    warmup: int = 3
    steps: int = 10
    autocast: bool = False  # bf16 autocast (CUDA)
    deadline: float = float("inf")  # time.monotonic() after which remaining rows are skipped


@dataclass
class Row:
    """One measured configuration."""

    policy: str
    kind: str  # "peer", "remat", "remat-matched" or "remat-sweep"
    status: str = "ok"  # "ok", "infeasible", "skipped" or "error: ..."
    peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    step_ms: float | None = None
    compile_s: float | None = None
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    solve_seconds: float | None = None
    mip_gap: float | None = None
    min_feasible_bytes: int | None = None
    matched_peer: str | None = None
    shared_with: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def within_budget(self) -> bool | None:
        if not self.ok or self.budget_bytes is None:
            return None
        return self.peak_bytes <= self.budget_bytes


def autocast(setup: Setup) -> contextlib.AbstractContextManager:
    if setup.autocast:
        return torch.autocast(torch.device(setup.device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def timed_steps(step: Callable[[], None], device: str, steps: int) -> list[float]:
    """Seconds of each of ``steps`` calls; CUDA events on GPU, wall clock on the CPU."""
    return [seconds_of_call(step, torch.device(device)) for _ in range(steps)]


def measure(row: Row, model: nn.Module, run: Callable[..., torch.Tensor], inputs: tuple, setup: Setup) -> Row:
    """Fill ``row`` with the peak, reserved peak, step time and compile time of ``run``."""

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast(setup):
            loss = run(*inputs)
        loss.backward()

    t0 = time.perf_counter()
    step()  # compiles, if anything does
    first = time.perf_counter() - t0
    for _ in range(max(0, setup.warmup - 1)):
        step()
    model.zero_grad(set_to_none=True)
    cuda = setup.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()  # so the reserved peak is this row's own
        torch.cuda.reset_peak_memory_stats()
    row.peak_bytes = budget_peak(step, model, inputs, setup.device)
    if cuda:
        row.reserved_peak_bytes = torch.cuda.max_memory_reserved()
    samples = timed_steps(step, setup.device, setup.steps)
    row.step_ms = statistics.median(samples) * 1e3
    row.compile_s = round(max(0.0, first - statistics.median(samples)), 2)
    row.extra["step_ms_min"] = min(samples) * 1e3
    model.zero_grad(set_to_none=True)
    return row


def guarded(row: Row, setup: Setup, fn: Callable[[], Row]) -> Row:
    """Run ``fn`` unless the deadline passed; record failures in the row instead of raising."""
    if time.monotonic() > setup.deadline:
        row.status = "skipped"
        return row
    try:
        return fn()
    except BudgetError as exc:
        row.status, row.min_feasible_bytes = "infeasible", exc.min_feasible_bytes
    except Exception as exc:  # a failing peer is a finding, recorded in its row
        log.warning("row %r failed: %s: %s", row.policy, type(exc).__name__, exc)
        log.debug("row %r failed", row.policy, exc_info=True)
        row.status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        adapter.reset_compiled()
        if setup.device == "cuda":
            torch.cuda.empty_cache()
    return row


def peer_row(peer: Peer, model: nn.Module, inputs: tuple, setup: Setup) -> Row:
    row = Row(peer.name, "peer")

    def go() -> Row:
        with peer.prepare(model, setup.backend) as run:
            return measure(row, model, run, inputs, setup)

    return guarded(row, setup, go)


def remat_row(row: Row, model: nn.Module, inputs: tuple, setup: Setup) -> Row:
    """Measure remat at ``row.budget_bytes`` (None: no budget)."""

    def go() -> Row:
        adapter.reset_compiled()
        budget = None if row.budget_bytes is None else row.budget_bytes / GIB
        compiled = remat.compile(model, budget_gb=budget, compiler=setup.compiler, headroom=setup.headroom)
        measure(row, model, compiled, inputs, setup)
        reps = remat.reports(compiled)
        row.predicted_peak_bytes = max(r.predicted_peak_bytes for r in reps)
        row.solve_seconds = round(sum(r.solve_seconds for r in reps), 3)
        row.mip_gap = max((r.mip_gap or 0.0) for r in reps)
        row.min_feasible_bytes = max(r.min_feasible_bytes for r in reps)
        compiled = [r.compiled_peak_bytes for r in reps if r.compiled_peak_bytes is not None]
        row.extra.update(compiled_peak_bytes=max(compiled) if compiled else None,
                         compile_attempts=max(r.compile_attempts for r in reps), graphs=len(reps), profile_s=round(sum(r.profile_seconds for r in reps), 3),
                         min_cut_seconds=round(sum(r.min_cut_seconds for r in reps), 3),
                         joint_graph_steps=sum(r.joint_graph_steps for r in reps))
        if len(reps) == 1:  # the peers' plans in remat's model, beside remat's own (one graph)
            rep = reps[0]
            rules = {**(rep.peer_rules or {}), "torch-min-cut": {"peak_bytes": rep.min_cut_peak_bytes,
                                                                  "overhead_seconds": rep.min_cut_overhead_seconds}}
            row.extra.update(predicted_overhead_ms=rep.predicted_overhead_seconds * 1e3, peer_rules=rules)
        return row

    return guarded(row, setup, go)


def plan_bounds(model: nn.Module, inputs: tuple, setup: Setup) -> dict[str, float]:
    """remat's smallest feasible budget and the budget above which no plan binds."""
    with autocast(setup):
        top = remat.plan(model, *inputs, compiler=setup.compiler, headroom=setup.headroom)
    adapter.reset_compiled()
    return {"min_feasible_bytes": top.min_feasible_bytes, "store_all_peak_bytes": top.store_all_peak_bytes,
            "unbinding_bytes": top.unbinding_budget_bytes, "headroom": top.headroom,
            "plan_solve_seconds": top.solve_seconds, "joint_graph_steps": top.joint_graph_steps}


def matched_row(peer: Row, done: list[Row], free: Row, model: nn.Module, inputs: tuple, setup: Setup,
                bounds: dict[str, float]) -> Row:
    """remat at ``peer``'s measured peak. A budget no plan is bound by shares the no-budget row; one
    within SHARE above a budget already measured, whose peak fits, shares that measurement."""
    row = Row(f"remat at {peer.policy} peak", "remat-matched", budget_bytes=peer.peak_bytes,
              matched_peer=peer.policy)
    budget = peer.peak_bytes
    twin = next((d for d in done if d.ok and budget * (1 - SHARE) <= d.budget_bytes <= budget
                 and d.peak_bytes <= budget), None)
    if budget >= bounds["unbinding_bytes"] and free.ok:
        twin = free
    if twin is not None:
        copy_measurement(row, twin)
        return row
    remat_row(row, model, inputs, setup)
    done.append(row)
    return row


def copy_measurement(row: Row, twin: Row) -> None:
    """Reuse ``twin``'s measurement for ``row`` (its budget is at most ``row``'s)."""
    for name in ("status", "peak_bytes", "reserved_peak_bytes", "step_ms", "compile_s", "predicted_peak_bytes",
                 "solve_seconds", "mip_gap", "min_feasible_bytes"):
        setattr(row, name, getattr(twin, name))
    row.shared_with = twin.policy
    row.extra.update({k: twin.extra[k] for k in ("predicted_overhead_ms", "peer_rules") if k in twin.extra})
    if twin.budget_bytes is None:
        row.extra["note"] = "budget at or above remat's store-all peak: the no-budget plan"


def sweep_rows(model: nn.Module, inputs: tuple, setup: Setup, bounds: dict[str, float]) -> list[Row]:
    low, high = bounds["min_feasible_bytes"], bounds["unbinding_bytes"]
    rows = []
    for fraction in SWEEP:
        budget = int(low + fraction * max(0.0, high - low))
        row = Row(f"remat sweep {fraction:.0%}", "remat-sweep", budget_bytes=budget)
        row.extra["fraction"] = fraction
        rows.append(remat_row(row, model, inputs, setup))
    return rows


PRIORITY = ("compile default", "compile checkpoint per block", "eager store-all", "eager checkpoint per block",
            "compile selective checkpoint (save matmuls)", "compile budget 0.5 (dp)", "compile budget 0.2 (dp)")


def priority(peer: Peer) -> int:
    """Order of measurement, so that a run cut short by its deadline has the telling rows."""
    return PRIORITY.index(peer.name) if peer.name in PRIORITY else len(PRIORITY)


def run_model(model: nn.Module, inputs: tuple, peers: list[Peer], setup: Setup, *, sweep: bool = True,
              progress: Callable[[Row], None] = lambda row: None) -> dict:
    """Every row for one model, plus remat's bounds: each peer then remat at its peak (telling rows first),
    remat with no budget after the first peer, then remat's own sweep. Rows come back in table order."""
    bounds = plan_bounds(model, inputs, setup)
    free = Row("remat (no budget)", "remat")
    measured: dict[str, Row] = {}
    matched: dict[str, Row] = {}
    done: list[Row] = []
    for i, peer in enumerate(sorted(peers, key=priority)):
        row = measured[peer.name] = peer_row(peer, model, inputs, setup)
        progress(row)
        if i == 0:
            progress(remat_row(free, model, inputs, setup))
        if row.ok:
            matched[peer.name] = matched_row(row, done, free, model, inputs, setup, bounds)
            progress(matched[peer.name])
    if not peers:
        progress(remat_row(free, model, inputs, setup))
    rows = [measured[p.name] for p in peers] + [free] + [matched[p.name] for p in peers if p.name in matched]
    if sweep:
        rows += sweep_rows(model, inputs, setup, bounds)
        for row in rows[-len(SWEEP):]:
            progress(row)
    return {"bounds": bounds, "rows": rows}


def row_count(peers: int, *, sweep: bool = True) -> int:
    """Upper bound on compiles per model (matched rows are often shared)."""
    return peers + 1 + peers + (len(SWEEP) if sweep else 0)
