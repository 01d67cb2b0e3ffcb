"""Reports and sweep frontiers for people: tables, HTML cards and figures.

pandas and matplotlib are optional (``pip install 'remat[notebook]'``) and
imported only when a table or a figure is asked for.
"""

from __future__ import annotations

import html
import importlib
import io
import sys
from collections import defaultdict
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from .errors import format_bytes
from .report import RULE_LABELS, NodeRow, Report

if TYPE_CHECKING:
    from .frontier import Frontier

COLUMNS = [f.name for f in fields(NodeRow)]
TOP_HOLDERS = 8


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


# --- Report ----------------------------------------------------------------------


def report_frame(report: Report) -> Any:
    pandas = optional("pandas", "Report.to_pandas")
    return pandas.DataFrame([asdict(n) for n in report.nodes], columns=COLUMNS)


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
            label=f"predicted peak {format_bytes(report.predicted_peak_bytes)}")
    ax.axvline(report.backward_starts_at, color="0.3", linewidth=0.8)
    ax.annotate("forward | backward", (report.backward_starts_at, 0), xytext=(0, 4), textcoords="offset points",
                ha="center", fontsize=8, color="0.3")
    ax.set_xlabel("step (forward, then backward)")
    ax.set_ylabel(f"memory alive ({unit})")
    ax.set_title(f"remat plan: {report.solver} ({report.solver_status})", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def row(label: str, value: str) -> str:
    return (f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
            f"<td style='text-align:left'>{html.escape(value)}</td></tr>")


def table(head: list[str], body: list[list[str]]) -> str:
    cells = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in head)
    rows = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r in body)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{rows}</tbody></table>"


def memory_rows(report: Report) -> list[tuple[str, str]]:
    fb = format_bytes
    budget = fb(report.budget_bytes) if report.budget_bytes is not None else "none (fastest plan)"
    if report.headroom and report.planned_budget_bytes is not None:
        budget += f"; plan fits {fb(report.planned_budget_bytes)} ({report.headroom:.0%} headroom)"
    out = [("budget", budget), ("predicted peak", fb(report.predicted_peak_bytes)),
           ("store-all peak", fb(report.store_all_peak_bytes)),
           ("smallest feasible budget", fb(report.min_feasible_bytes)
            + ("" if report.min_feasible_exact else " (the model's estimate)"))]
    if report.compiled_peak_bytes is not None:
        out.insert(2, ("compiled program's peak (Inductor)", fb(report.compiled_peak_bytes)))
    if report.min_cut_peak_bytes is not None:
        out.append(("torch min-cut peak", fb(report.min_cut_peak_bytes)))
    if report.realized_peak_bytes is not None:
        out.append(("realized graphs, op by op", fb(report.realized_peak_bytes)))
    if report.measured_peak_bytes is not None:
        ratio = report.measured_peak_bytes / report.predicted_peak_bytes if report.predicted_peak_bytes else 0.0
        out.append(("measured peak", f"{fb(report.measured_peak_bytes)} ({ratio:.2f}x predicted)"))
    return out


def cost_rows(report: Report) -> list[tuple[str, str]]:
    out = [("added time (predicted)", f"{report.predicted_overhead_seconds * 1e3:+.3f} ms vs keeping everything")]
    if report.min_cut_overhead_seconds is not None:
        out.append(("torch min-cut added time", f"{report.min_cut_overhead_seconds * 1e3:+.3f} ms"))
    for name, rule in (report.peer_rules or {}).items():
        out.append((f"{RULE_LABELS.get(name, name)} in the model", f"{format_bytes(rule['peak_bytes'])}, "
                                                                    f"{rule['overhead_seconds'] * 1e3:+.3f} ms"))
    gap = "n/a" if report.mip_gap is None else f"{report.mip_gap:.2%}"
    out += [("solver", f"{report.solver}: {report.solver_status}, gap {gap}, {report.solve_seconds:.2f} s"),
            ("profiling", f"{report.profile_seconds:.2f} s, {report.joint_graph_steps} steps, "
                          f"{report.candidates} candidates" + (f", on {report.device}" if report.device else ""))]
    if report.plan_cache == "hit":
        out.append(("plan cache", "loaded from disk: solve and profile times are those of the stored plan"))
    elif report.plan_cache == "program":
        out.append(("plan cache", "plan and compiled program loaded from disk: solve and profile times are "
                                  "those of the stored plan"))
    return out


def recomputed_by_category(report: Report) -> list[list[str]]:
    """Recomputed ops grouped by op type: count, bytes freed, recompute time."""
    groups: dict[str, list[NodeRow]] = defaultdict(list)
    for n in report.nodes:
        if n.decision == "recomputed":
            groups[n.category or "other"].append(n)
    ordered = sorted(groups.items(), key=lambda kv: -sum(n.bytes for n in kv[1]))
    return [[category, str(len(rows)), format_bytes(sum(n.bytes for n in rows)),
             f"{sum(n.added_seconds for n in rows) * 1e3:.3f} ms"] for category, rows in ordered]


def top_holders(report: Report) -> list[list[str]]:
    """Kept activations holding the most memory, with why they are kept."""
    kept = sorted((n for n in report.nodes if n.decision == "kept"), key=lambda n: -n.bytes)[:TOP_HOLDERS]
    return [[n.name, n.op.removeprefix("aten."), format_bytes(n.bytes), n.reason] for n in kept]


def report_html(report: Report) -> str:
    """The summary card a notebook shows for a Report."""
    memory = "".join(row(k, v) for k, v in memory_rows(report) + cost_rows(report))
    counts = defaultdict(int)
    for n in report.nodes:
        counts[n.decision] += 1
    decided = ", ".join(f"{counts[d]} {d}" for d in ("kept", "recomputed", "freed") if counts[d])
    parts = [f"<div class='remat-report'><b>remat report</b> ({html.escape(decided)})",
             f"<table>{memory}</table>",
             "<p><b>Largest kept activations</b></p>",
             table(["node", "op", "bytes", "reason"], top_holders(report)) if report.saved else "<p>none</p>",
             "<p><b>Recomputed, by op type</b></p>",
             table(["op type", "values", "bytes freed", "recompute time"], recomputed_by_category(report))
             if report.recomputed else "<p>nothing recomputed</p>"]
    parts += [f"<p>note: {html.escape(n)}</p>" for n in report.notes]
    return "".join(parts) + "</div>"


# --- Frontier --------------------------------------------------------------------


def frontier_cells(frontier: Frontier) -> tuple[list[str], list[list[str]]]:
    head = ["budget", "feasible", "predicted peak", "added time", "recomputed", "status"]
    if frontier.measured:
        head += ["measured peak", "step time"]
    body = []
    for r in frontier.rows:
        cells = [format_bytes(r["budget_bytes"]), "yes" if r["feasible"] else "no",
                 "" if r["predicted_peak_bytes"] is None else format_bytes(r["predicted_peak_bytes"]),
                 "" if r["predicted_overhead_seconds"] is None else f"{r['predicted_overhead_seconds'] * 1e3:+.3f} ms",
                 "" if r["recomputed"] is None else str(r["recomputed"]), r["status"]]
        if frontier.measured:
            cells += ["" if r.get("measured_peak_bytes") is None else format_bytes(r["measured_peak_bytes"]),
                      "" if r.get("step_seconds") is None else f"{r['step_seconds'] * 1e3:.1f} ms"]
        body.append(cells)
    return head, body


def frontier_header(frontier: Frontier) -> str:
    fb = format_bytes
    text = (f"store-all peak {fb(frontier.store_all_peak_bytes)}, smallest feasible budget "
            f"{fb(frontier.min_feasible_bytes)}, compiler {frontier.compiler}, planned on {frontier.device or 'cpu'}")
    return text + (f", measured on {frontier.measured_device}" if frontier.measured else "")


def frontier_html(frontier: Frontier) -> str:
    head, body = frontier_cells(frontier)
    return (f"<div class='remat-frontier'><b>remat budget sweep</b><p>{html.escape(frontier_header(frontier))}</p>"
            f"{table(head, body)}</div>")


def frontier_markdown(frontier: Frontier) -> str:
    head, body = frontier_cells(frontier)
    lines = ["# remat budget sweep", "", frontier_header(frontier), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body]) + "\n"


def frontier_frame(frontier: Frontier) -> Any:
    pandas = optional("pandas", "Frontier.to_pandas")
    return pandas.DataFrame(frontier.rows)


def frontier_figure(frontier: Frontier) -> Any:
    """Predicted peak against predicted added time, one point per feasible budget."""
    fig = new_figure("Frontier.plot", (6.4, 4.2))
    ax = fig.add_subplot()
    feasible = sorted((r for r in frontier.rows if r["feasible"]), key=lambda r: r["predicted_overhead_seconds"])
    div, unit = scale([frontier.store_all_peak_bytes] + [r["predicted_peak_bytes"] for r in feasible])
    xs = [r["predicted_overhead_seconds"] * 1e3 for r in feasible]
    ax.plot(xs, [r["predicted_peak_bytes"] / div for r in feasible], "o-", color="C0", label="predicted peak")
    for x, r in zip(xs, feasible):
        ax.annotate(f"budget {format_bytes(r['budget_bytes'])}", (x, r["predicted_peak_bytes"] / div),
                    xytext=(5, 4), textcoords="offset points", fontsize=7, color="0.3")
    if frontier.measured:
        measured = [(x, r["measured_peak_bytes"]) for x, r in zip(xs, feasible)
                    if r.get("measured_peak_bytes") is not None]
        ax.plot([x for x, _ in measured], [m / div for _, m in measured], "s", color="C1",
                label=f"measured peak ({frontier.measured_device})")
    ax.axhline(frontier.store_all_peak_bytes / div, color="0.6", linestyle="--", label="keep everything")
    ax.axhline(frontier.min_feasible_bytes / div, color="C3", linestyle=":", label="smallest feasible budget")
    ax.set_xlabel("predicted added time (ms per step)")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.set_title("remat: memory against recompute time", fontsize=10)
    ax.legend(fontsize=8)
    return fig
