"""A Report for people: the summary's words, its tables and its memory figure.

The card (HTML) is in :mod:`remat.render_html` and the sweep frontier's renderings in
:mod:`remat.render_frontier`; both use the helpers here (``optional``, ``scale``,
``Unit``, ``summary_rows``). pandas and matplotlib are optional
(``pip install 'remat[notebook]'``) and imported only when a table or a figure is asked for.
"""

from __future__ import annotations

import importlib
import io
import sys
from dataclasses import asdict, dataclass
from typing import Any

from .errors import format_bytes
from .report import RULE_LABELS, Report
from .report_rows import gap_text

# to_pandas's columns: every NodeRow field, the user's names first
COLUMNS = ["name", "module", "label", "input_name", "op", "category", "decision", "reason", "bytes",
           "workspace", "flops", "seconds", "added_seconds", "source"]


def optional(module: str, what: str) -> Any:
    """Import an optional dependency, or say in one line how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs {module.split('.')[0]}: pip install 'remat[notebook]'") from None


def new_figure(what: str, size: tuple[float, float]) -> Any:
    """A Figure that belongs to no pyplot state (no global figure list, no backend)."""
    figure = optional("matplotlib.figure", what)
    show_figures_in_ipython(figure.Figure)
    return figure.Figure(figsize=size, layout="constrained")


def show_figures_in_ipython(figure_class: type) -> None:
    """In IPython, display Figures as PNG even when pyplot was never imported
    (it is pyplot's inline backend that usually registers this)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return
    png = shell.display_formatter.formatters["image/png"]
    if not any(issubclass(figure_class, known) for known in png.type_printers):
        png.for_type(figure_class, figure_png)


def figure_png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def scale(values: list[int]) -> tuple[float, str]:
    """A unit that suits the largest of ``values``."""
    top = max(values, default=0)
    return (2**30, "GiB") if top >= 2**30 else (2**20, "MiB") if top >= 2**20 else (2**10, "KiB")


# --- Report: words ------------------------------------------------------------------
# The summary and the card say the same rows in the same words (``summary_rows``); each
# table gives every figure in one unit, that of its largest.

TOP_MODULES = 5
TOP_LABELS = 4
NOT_COMPUTED = "not computed (read report.{field} to compute it{cost})"
TOP_LEVEL = "(no submodule recorded)"  # the model's own code, or a value with no name


@dataclass(frozen=True)
class Unit:
    """Bytes in one unit for one table."""

    div: float
    name: str

    @staticmethod
    def of(values: list[int | None]) -> Unit:
        div, name = scale([abs(v) for v in values if v is not None])
        return Unit(div, name)

    def __call__(self, nbytes: float | None) -> str:
        return "none" if nbytes is None else f"{nbytes / self.div:.3f} {self.name}"  # as format_bytes


def table_unit(report: Report) -> Unit:
    return Unit.of([report.budget_bytes, report.store_all_peak_bytes, report.peak_bytes,
                    report.predicted_peak_bytes])


def share_text(report: Report) -> str:
    """Added time as a share of the step: "+2.0 % step time", "1.5 % faster than store-all"."""
    added, step = report.predicted_overhead_seconds, report.step_seconds
    if not step or abs(added) < 5e-4 * step:
        return "no added time" if abs(added) < 1e-12 or not step else "under 0.1 % added time"
    share = f"{abs(added) / step * 100:.1f} %"
    return f"+{share} step time" if added > 0 else f"{share} faster than store-all"


def outcome(report: Report, unit: Unit | None = None) -> str:
    """The first line: whether the plan fits, its peak (labelled which), store-all, the time it costs."""
    fb = unit or table_unit(report)
    peak = f"peak {fb(report.peak_bytes)} ({report.peak_source})"
    store_all = f"store-all {fb(report.store_all_peak_bytes)}"
    timing = f"{share_text(report)} (predicted)"
    if report.budget_bytes is None:
        return f"no budget: the fastest plan, {peak}, {store_all}, {timing}"
    budget = fb(report.budget_bytes)
    if report.peak_bytes > report.budget_bytes:
        return f"over budget: {peak} above the {budget} budget by {fb(report.peak_bytes - report.budget_bytes)}"
    if not any(n.bytes for n in report.nodes if n.decision == "recomputed"):
        return f"fits without recomputing: {peak} under a {budget} budget ({store_all})"
    return f"fits: {peak} under a {budget} budget ({store_all}), {timing}"


def not_computed(field: str, cost: str = "") -> str:
    return NOT_COMPUTED.format(field=field, cost=cost)


def peak_rows(report: Report, fb: Unit) -> list[tuple[str, str]]:
    """Every peak known, each once, by where it comes from; the one compared with the budget marked."""
    compared = " (compared with the budget)"
    rows = [("predicted peak", f"{fb(report.predicted_peak_bytes)}, remat's estimate before compiling"
             + (compared if report.peak_source == "predicted" else ""))]
    if report.compiled_peak_bytes is not None:
        how = "loaded with its plan" if report.plan_cache == "program" else f"{report.compile_attempts} plan(s) compiled"
        rows.append(("compiled program peak", f"{fb(report.compiled_peak_bytes)} (Inductor's, {how})"
                     + (compared if report.peak_source == "compiled program" else "")))
    if report.measured_peak_bytes is not None:
        ratio = report.measured_peak_bytes / report.predicted_peak_bytes if report.predicted_peak_bytes else 0.0
        rows.append(("measured peak", f"{fb(report.measured_peak_bytes)} on a step ({ratio:.2f}x predicted){compared}"))
    rows.append(("store-all peak", f"{fb(report.store_all_peak_bytes)}: every activation kept, nothing recomputed"))
    return rows


def smallest_feasible(report: Report, fb: Unit) -> str:
    """The smallest budget remat accepts, as far as it is known: computing it may solve or compile."""
    low = report.peek("min_feasible_bytes")
    if low is None:
        return not_computed("min_feasible_bytes", "; under Inductor that compiles")
    exact = report.peek("min_feasible_exact")
    how = ("exact: its plan compiled" if report.compiled_peak_bytes is not None else "exact, op by op") if exact \
        else "remat's estimate: remat.plan compiles it exactly"
    return f"{fb(low)} ({how}); a lower budget is refused"


def added_time(report: Report) -> str:
    added = report.predicted_overhead_seconds
    text = f"{added * 1e3:+.3f} ms per step vs store-all, predicted ({share_text(report)})"
    if added < 0:
        text += (": faster than store-all, which writes out values the compiler would otherwise compute "
                 "inside the kernels that read them; this plan recomputes them there instead")
    return text


def decided(report: Report, fb: Unit) -> str:
    """How many activations (values holding memory) the plan recomputes and keeps, and their bytes."""
    recomputed = [n for n in report.nodes if n.decision == "recomputed" and n.bytes]
    kept = [n for n in report.nodes if n.decision == "kept" and n.bytes]
    activations = sum(1 for n in report.nodes if n.decision in ("kept", "recomputed", "freed") and n.bytes)
    views = sum(1 for n in report.nodes if n.decision == "recomputed" and not n.bytes)
    return (f"{len(recomputed)} of {activations} activations, freeing {fb(sum(n.bytes for n in recomputed))}; "
            f"keeps {len(kept)}, holding {fb(sum(n.bytes for n in kept))}"
            + (f" (and {views} views, free to recompute)" if views else ""))


def peer_text(report: Report, fb: Unit) -> str:
    """The other plans scored by remat's estimate, those computed; the others say how to compute them."""
    parts, missing = [], []
    peak, added = report.peek("min_cut_peak_bytes"), report.peek("min_cut_overhead_seconds")
    if "min_cut_peak_bytes" in report.pending:
        missing.append("report.min_cut_peak_bytes")
    elif peak is not None:
        parts.append(f"torch's own partitioner {fb(peak)}, {added * 1e3:+.3f} ms")
    rules = report.peek("peer_rules")
    if "peer_rules" in report.pending:
        missing.append("report.peer_rules")
    for name, rule in (rules or {}).items():
        parts.append(f"{RULE_LABELS.get(name, name)} {fb(rule['peak_bytes'])}, {rule['overhead_seconds'] * 1e3:+.3f} ms")
    if missing:
        parts.append(f"not computed (read {' and '.join(missing)})")
    return "; ".join(parts)


def scope_rows(report: Report, fb: Unit) -> list[tuple[str, str]]:
    """What the budget counts outside this graph, under a step or per-rank budget."""
    outside = (report.eager_bytes, report.resident_bytes, report.other_state_bytes, report.graphs_bytes,
               report.comm_bytes, report.copies_kept_bytes)
    if not any(outside):
        return []  # nothing outside the graph was counted
    if report.budget_scope == "step":
        eager = "reserved" if report.eager_reserved else "measured"
        state = fb(report.resident_bytes + report.other_state_bytes)
        return [("counted outside the graph", f"{fb(report.eager_bytes)} for the code after it ({eager}; a loss "
                 f"computed outside the model, for one), {state} of model state it does not read, "
                 f"{fb(report.graphs_bytes)} held by other graphs")]
    if report.budget_scope == "rank":
        return [("counted outside the graph", f"{fb(report.resident_bytes)} resident, {fb(report.comm_bytes)} "
                 f"communication, {fb(report.copies_kept_bytes)} kept by {report.kept_copies} other copies, "
                 f"{fb(report.eager_bytes)} eager head and loss")]
    return []


def cache_text(report: Report) -> str:
    if report.plan_cache == "hit":
        return "loaded from disk: solve and profile times are those of the stored plan"
    if report.plan_cache == "program":
        return "plan and compiled program loaded from disk: solve and profile times are those of the stored plan"
    return ""


def summary_rows(report: Report, fb: Unit) -> list[tuple[str, str]]:
    """The rows the summary and the card share, in one unit ``fb``; computes nothing."""
    budget = "none: the fastest plan" if report.budget_bytes is None else fb(report.budget_bytes)
    if report.headroom and report.planned_budget_bytes is not None and report.budget_bytes is not None:
        budget += f" (planned to {fb(report.planned_budget_bytes)}: {report.headroom:.0%} held back)"
    rows = [("budget", budget), *peak_rows(report, fb), ("smallest feasible budget", smallest_feasible(report, fb)),
            ("added time", added_time(report)), ("recomputes", decided(report, fb))]
    rows += [("by module", line) for line in module_lines(report, fb)]
    others = peer_text(report, fb)
    if others:
        rows.append(("other plans, estimated", others))
    rows += scope_rows(report, fb)
    if report.realized_peak_bytes is not None:
        unfused = fb(report.realized_peak_bytes)
        if report.compiled_peak_bytes is not None:  # (it can exceed the budget: it is not what runs)
            unfused += " if run unfused (compiler=\"eager\"); the compiled program's peak is what runs"
        rows.append(("partitioned graphs, op by op", unfused))
    rows.append(("solver", f"{report.solver} ({report.solver_status}, gap {gap_text(report.mip_gap)}) in "
                           f"{report.solve_seconds:.2f} s; profiled {report.joint_graph_steps} ops in "
                           f"{report.profile_seconds:.2f} s" + (f" on {report.device}" if report.device else "")))
    if report.timings:
        rows.append(("compile time", report.timings_text()))
    if cache_text(report):
        rows.append(("plan cache", cache_text(report)))
    return rows


def labels_text(labels: list[str]) -> str:
    return ", ".join(labels[:TOP_LABELS]) + (", ..." if len(labels) > TOP_LABELS else "")


def module_name(module: str) -> str:
    return module or TOP_LEVEL


def module_lines(report: Report, fb: Unit, top: int = TOP_MODULES) -> list[str]:
    """The modules holding the most activation memory: what each recomputes and keeps."""
    lines = []
    for group in report.by_module()[:top]:
        parts = []
        if group["recomputed"]:
            parts.append(f"recomputes {labels_text(group['recomputed'])} ({fb(group['recomputed_bytes'])})")
        if group["kept"]:
            parts.append(f"keeps {labels_text(group['kept'])} ({fb(group['kept_bytes'])})")
        lines.append(f"{module_name(group['module'])}: {'; '.join(parts)}")
    return lines


def report_text(report: Report) -> str:
    """``Report.summary``: the outcome, then one row a line."""
    fb = table_unit(report)
    rows = summary_rows(report, fb)
    width = 2 + max(len(label) for label, _ in rows)
    lines = [outcome(report, fb)]
    last = None
    for label, value in rows:
        lines.append(f"{'' if label == last else label:<{width}}{value}")
        last = label
    return "\n".join(lines + [f"note: {n}" for n in report.notes])


# --- Report: tables, page, figure --------------------------------------------------


def report_frame(report: Report) -> Any:
    pandas = optional("pandas", "Report.to_pandas")
    return pandas.DataFrame([asdict(n) for n in report.nodes], columns=COLUMNS)


def module_frame(report: Report) -> Any:
    pandas = optional("pandas", "Report.to_pandas")
    columns = ["module", "recomputed", "kept", "recomputed_bytes", "kept_bytes"]
    return pandas.DataFrame([{**g, "recomputed": ", ".join(g["recomputed"]), "kept": ", ".join(g["kept"])}
                             for g in report.by_module()], columns=columns)


def report_figure(report: Report) -> Any:
    """Memory over the step: store-all, the plan, the budget, the peak marked."""
    if not report.plan_timeline:
        raise ValueError("this report holds no memory timeline (it was made without one); plan again to plot it")
    fig = new_figure("Report.plot", (9, 3.6))
    ax = fig.add_subplot()
    lines = report.store_all_timeline + report.plan_timeline + [report.budget_bytes or 0]
    div, unit = scale(lines)
    steps = report.timeline_steps
    ax.step(steps, [b / div for b in report.store_all_timeline], where="post", color="0.6", label="keep everything")
    ax.step(steps, [b / div for b in report.plan_timeline], where="post", color="C0", label="plan")
    if report.budget_bytes is not None:
        ax.axhline(report.budget_bytes / div, color="C3", linestyle="--",
                   label=f"budget {format_bytes(report.budget_bytes)}")
        if report.planned_budget_bytes is not None and report.headroom:
            ax.axhline(report.planned_budget_bytes / div, color="C3", linestyle=":", linewidth=1,
                       label=f"budget less {report.headroom:.0%} headroom")
    peak = max(range(len(report.plan_timeline)), key=report.plan_timeline.__getitem__)
    ax.plot([steps[peak]], [report.plan_timeline[peak] / div], "v", color="C0", markersize=9,
            label=f"predicted peak {format_bytes(report.predicted_peak_bytes)}"
            + (f" in {report.peak_module}" if report.peak_module else ""))
    shade_modules(ax, report)
    ax.axvline(report.backward_starts_at, color="0.3", linewidth=0.8)
    ax.annotate("forward | backward", (report.backward_starts_at, 0), xytext=(0, 4), textcoords="offset points",
                ha="center", fontsize=8, color="0.3")
    ax.set_xlabel("step (forward, then backward)")
    ax.set_ylabel(f"memory alive ({unit})")
    ax.set_title(f"remat plan: {report.solver} ({report.solver_status})", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside: the layer names are on top
    return fig


MAX_SPAN_LABELS = 40


def shade_modules(ax: Any, report: Report) -> None:
    """Shade every other layer's steps and name the layers wide enough to read (``module_spans``)."""
    spans = report.module_spans
    if not spans:
        return
    width = max(spans[-1][1], 1)
    wide = [s for s in spans if s[1] - s[0] >= width / 50]
    named = wide if len(wide) <= MAX_SPAN_LABELS else []
    for i, (start, end, module) in enumerate(spans):
        if i % 2:
            ax.axvspan(start, end, color="0.5", alpha=0.08, linewidth=0)
    for start, end, module in named:
        ax.annotate(module, ((start + end) / 2, 1), xycoords=("data", "axes fraction"), xytext=(0, -3),
                    textcoords="offset points", rotation=90, ha="center", va="top", fontsize=6, color="0.35")
