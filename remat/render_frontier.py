"""A sweep's Frontier for people: its table as Markdown, HTML and a pandas DataFrame,
and its figure (predicted peak against added time). pandas and matplotlib are imported
only when a table or the figure is asked for (``remat.render.optional``).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from .errors import format_bytes
from .render import new_figure, optional, scale
from .render_html import table

if TYPE_CHECKING:
    from .frontier import Frontier


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
