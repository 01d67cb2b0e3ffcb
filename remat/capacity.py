"""What fits: the largest batch or sequence length whose step fits a budget (``remat.fit``).

Each size tried is captured at its own sizes (on the meta device nothing is allocated or run:
see :func:`remat.plan`'s ``device``) and judged as ``remat.compile`` would judge it: under Inductor,
where its program can be generated, by compiling under the budget (refused: captured once more
without it, for the curve's figures); otherwise by one more solve of the captured plan at the
budget. Sizes double from ``low`` until one is refused, then the gap is bisected.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from remat.passes.devices import DeviceSpec, device_spec, program_accounted
from remat.passes.decide.graph_plan import GraphPlan, plan_at
from remat.solvers.errors import format_bytes

from .api import captured
from .errors import BudgetError
from .options import Options
from .report import Report, report_of

VARIES = ("batch", "seq")
MAX_DOUBLINGS = 40  # 2**40 times low: a model whose every size fits is a bug in make_inputs


@dataclass(frozen=True)
class FitPoint:
    """One size tried: whether it fits, and each way of training it as the same model scores it.

    Peaks are bytes of the whole step, added times are seconds per step over store-all's."""

    size: int
    fits: bool
    min_feasible_bytes: int  # remat's smallest peak at this size
    remat_peak_bytes: int | None  # remat's plan under the budget (None where it does not fit)
    remat_added_seconds: float | None
    store_all_peak_bytes: int  # every activation kept
    checkpoint_blocks_peak_bytes: int | None  # torch.utils.checkpoint around every block (None: no blocks found)
    checkpoint_blocks_added_seconds: float | None
    capture_seconds: float  # capture, profile and solves at this size


@dataclass
class Fit:
    """What ``remat.fit`` found: ``size`` the largest that fits, ``report`` its plan."""

    size: int
    vary: str
    budget_bytes: int
    report: Report
    curve: list[FitPoint] = field(default_factory=list)  # every size tried, in size order
    captured: list[int] = field(default_factory=list)  # the sizes captured, in the order tried
    device: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "vary": self.vary, "budget_bytes": self.budget_bytes, "device": self.device,
                "captured": list(self.captured), "curve": [dataclasses.asdict(p) for p in self.curve]}

    def to_markdown(self) -> str:
        """The curve as a table, one row per size tried."""
        def cell(value: int | float | None, fmt: Callable[[Any], str]) -> str:
            return "-" if value is None else fmt(value)

        ms = lambda s: f"{s * 1e3:+.3f} ms"  # noqa: E731
        rows = [f"| {self.vary} | fits | smallest peak | remat peak | remat added | store-all peak "
                f"| checkpoint per block peak | its added |", "|---:|:-:|---:|---:|---:|---:|---:|---:|"]
        for p in self.curve:
            rows.append(f"| {p.size} | {'yes' if p.fits else 'no'} | {format_bytes(p.min_feasible_bytes)} "
                        f"| {cell(p.remat_peak_bytes, format_bytes)} | {cell(p.remat_added_seconds, ms)} "
                        f"| {format_bytes(p.store_all_peak_bytes)} "
                        f"| {cell(p.checkpoint_blocks_peak_bytes, format_bytes)} "
                        f"| {cell(p.checkpoint_blocks_added_seconds, ms)} |")
        return "\n".join(rows)

    def plot(self, ax: Any = None) -> Any:
        """Peak against size for remat (smallest and at the budget), store-all and checkpoint per
        block, with the budget; matplotlib is imported here."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        sizes = [p.size for p in self.curve]
        gib = 2 ** 30
        ax.plot(sizes, [p.store_all_peak_bytes / gib for p in self.curve], "o-", label="store-all")
        blocks = [(p.size, p.checkpoint_blocks_peak_bytes / gib) for p in self.curve
                  if p.checkpoint_blocks_peak_bytes is not None]
        if blocks:
            ax.plot(*zip(*blocks), "s-", label="checkpoint per block")
        ax.plot(sizes, [p.min_feasible_bytes / gib for p in self.curve], "^-", label="remat, smallest peak")
        ax.axhline(self.budget_bytes / gib, color="gray", linestyle="--", label="budget")
        ax.axvline(self.size, color="green", linestyle=":", label=f"largest that fits: {self.size}")
        ax.set_xlabel(self.vary)
        ax.set_ylabel("step peak (GiB)")
        ax.set_xscale("log", base=2)
        ax.legend()
        return ax


def fit(model: torch.nn.Module | Callable[[int], torch.nn.Module], make_inputs: Callable[[int], Sequence[Any]], *,
        budget_gb: float, vary: str = "batch", low: int = 1, high: int | None = None,
        device: str | DeviceSpec | None = None, **options: Any) -> Fit:
    """The largest size whose training step remat fits in ``budget_gb`` GiB.

    ``make_inputs(size)`` returns the model's inputs at that size (the batch or the sequence
    length, as ``vary`` says); ``model`` is the module, or a function of the size that builds it
    (for a model whose buffers depend on the sequence length). On the meta device nothing is
    allocated or run and ``device`` names the device planned for (see :func:`remat.plan`);
    ``options`` are :class:`remat.Options`. Raises :class:`remat.BudgetError` when ``low`` does
    not fit. A size fits when remat plans it within the budget as ``remat.compile`` would: under
    Inductor, where its program is generated (the real device; the CPU from meta), when a plan's
    compiled program fits; otherwise when the model's plan at the budget does.
    """
    if budget_gb is None:
        raise ValueError("fit needs a budget: budget_gb=<GiB> (the device's memory, less what else it holds)")
    if vary not in VARIES:
        raise ValueError(f"vary must be one of {VARIES}, not {vary!r}")
    if isinstance(low, bool) or not isinstance(low, int) or low < 1 or (high is not None and high < low):
        raise ValueError(f"low must be a whole number >= 1 and high None or >= low, got low={low!r}, high={high!r}")
    chosen = Options.from_mapping({**options, "budget_gb": budget_gb})
    base_options = dataclasses.replace(chosen, budget_gb=None)  # each size planned once, then solved at the budget
    points: dict[int, tuple[FitPoint, GraphPlan | None, GraphPlan]] = {}

    def tried(size: int) -> bool:
        if size not in points:
            points[size] = point_at(size, model, make_inputs, base_options, chosen, device)
        return points[size][0].fits

    best, _ = search(tried, low, high)
    if best is None:
        p = points[low][0]
        raise BudgetError(f"{vary}={low} does not fit {budget_gb} GiB: remat's smallest peak there is "
                          f"{p.min_feasible_bytes / 2**30:.3f} GiB", budget_bytes=chosen.budget_bytes or 0,
                          min_feasible_bytes=p.min_feasible_bytes)
    _, at_budget, base = points[best]
    report = report_of(at_budget)
    return Fit(best, vary, chosen.budget_bytes or 0, report, [points[s][0] for s in sorted(points)], list(points),
               str(base.problem.meta.get("device", "")))


def search(fits: Callable[[int], bool], low: int, high: int | None) -> tuple[int | None, int | None]:
    """The largest size in [low, high] that ``fits`` (None if low does not) and the smallest refused
    one seen: doubling from ``low`` until refused or past ``high``, then bisecting.

    >>> search(lambda n: n <= 11, 1, None)
    (11, 12)
    >>> search(lambda n: n <= 11, 1, 8)
    (8, None)
    """
    if not fits(low):
        return None, low
    best, size = low, low
    for _ in range(MAX_DOUBLINGS):
        size = min(size * 2, high) if high is not None else size * 2
        if size == best:
            return best, None
        if not fits(size):
            break
        best = size
    else:
        raise ValueError(f"every size up to {best} fits: does make_inputs(size) grow with size?")
    refused = size
    while refused - best > 1:
        middle = (best + refused) // 2
        best, refused = (middle, refused) if fits(middle) else (best, middle)
    return best, refused


def point_at(size: int, model: torch.nn.Module | Callable[[int], torch.nn.Module],
             make_inputs: Callable[[int], Sequence[Any]], options: Options, budgeted: Options,
             device: str | DeviceSpec | None) -> tuple[FitPoint, GraphPlan | None, GraphPlan]:
    """Plan ``size`` and judge it against ``budgeted``'s budget: the curve's point, the plan at the
    budget (None if refused) and the captured plan. Every size is captured at its own sizes
    (``dynamic=False``): the program a training loop at that size compiles, which a symbolic capture's
    program is not (its buffers are planned for any size)."""
    t0 = time.perf_counter()
    module = model if isinstance(model, torch.nn.Module) else model(size)
    inputs = tuple(make_inputs(size))
    if program_accounted(options.compiler, None if device is None else device_spec(device)):
        base, at_budget = compiled_at(module, inputs, options, budgeted, device)
    else:
        base = captured(module, inputs, options, device=device, dynamic=False).plans[0]
        at = plan_at(base, budgeted.budget_bytes)  # the model's plan at the budget: what remat.compile solves
        at_budget = at.revised(notes=base.notes) if isinstance(at, GraphPlan) else None
    figures = report_of(base)
    blocks = (figures.peer_rules or {}).get("checkpoint-blocks")
    peak = None if at_budget is None else at_budget.compiled_peak_bytes or at_budget.solution.peak_bytes
    point = FitPoint(
        size=size, fits=at_budget is not None, min_feasible_bytes=figures.min_feasible_bytes,
        remat_peak_bytes=peak, remat_added_seconds=None if at_budget is None
        else at_budget.solution.added_seconds - at_budget.store_all.added_seconds,
        store_all_peak_bytes=figures.store_all_peak_bytes,
        checkpoint_blocks_peak_bytes=None if blocks is None else int(blocks["peak_bytes"]),
        checkpoint_blocks_added_seconds=None if blocks is None else float(blocks["overhead_seconds"]),
        capture_seconds=time.perf_counter() - t0)
    return point, at_budget, base


def compiled_at(module: torch.nn.Module, inputs: tuple[Any, ...], options: Options, budgeted: Options,
                device: str | DeviceSpec | None) -> tuple[GraphPlan, GraphPlan | None]:
    """The plan ``remat.compile`` would compile under the budget (its program fits) and that plan
    again as the base, or, where the budget is refused, the plan without one (for the curve's other
    figures) and None. The fitting loop may accept a plan below the model's smallest peak, so the
    budget is tried, not solved for."""
    try:
        plan = captured(module, inputs, budgeted, device=device, dynamic=False).plans[0]
        return plan, plan
    except BudgetError:
        return captured(module, inputs, options, device=device, dynamic=False).plans[0], None
