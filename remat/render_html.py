"""A Report's card: the HTML a notebook shows (``Report._repr_html_``) and the page
``Report.to_html`` writes, with its tables (the largest modules, the largest kept
activations, what is recomputed by op type); ``table`` also serves the sweep frontier's card.
It says the summary's rows in the summary's words (``remat.render``) and computes nothing.
"""

from __future__ import annotations

import html
from collections import defaultdict

from .render import Unit, labels_text, module_name, outcome, summary_rows, table_unit
from .report import NodeRow, Report
from .report_rows import short_op

TOP_HOLDERS = 8


def row(label: str, value: str) -> str:
    return (f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
            f"<td style='text-align:left'>{html.escape(value)}</td></tr>")


def table(head: list[str], body: list[list[str]]) -> str:
    cells = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in head)
    rows = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r in body)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{rows}</tbody></table>"


def recomputed_by_category(report: Report) -> list[list[str]]:
    """Recomputed ops grouped by op type: count, bytes freed, recompute time (one unit)."""
    groups: dict[str, list[NodeRow]] = defaultdict(list)
    for n in report.nodes:
        if n.decision == "recomputed":
            groups[n.category or "other"].append(n)
    ordered = sorted(groups.items(), key=lambda kv: -sum(n.bytes for n in kv[1]))
    fb = Unit.of([sum(n.bytes for n in rows) for _, rows in ordered])
    return [[category, str(len(rows)), fb(sum(n.bytes for n in rows)),
             f"{sum(n.added_seconds for n in rows) * 1e3:.3f} ms"] for category, rows in ordered]


def top_holders(report: Report) -> list[list[str]]:
    """Kept activations holding the most memory, with where they come from and why they are kept."""
    kept = sorted((n for n in report.nodes if n.decision == "kept"), key=lambda n: -n.bytes)[:TOP_HOLDERS]
    fb = Unit.of([n.bytes for n in kept])
    return [[module_name(n.module), n.label, short_op(n.op), fb(n.bytes), n.source, n.reason, n.name]
            for n in kept]


def module_table(report: Report) -> list[list[str]]:
    groups = report.by_module()
    fb = Unit.of([g["recomputed_bytes"] + g["kept_bytes"] for g in groups])
    return [[module_name(g["module"]), labels_text(g["recomputed"]), fb(g["recomputed_bytes"]),
             labels_text(g["kept"]), fb(g["kept_bytes"])] for g in groups]


def report_html(report: Report) -> str:
    """The card a notebook shows for a Report: the summary's outcome and rows, then tables; computes nothing."""
    fb = table_unit(report)
    rows = "".join(row(k, v) for k, v in summary_rows(report, fb) if k != "by module")
    parts = [f"<div class='remat-report'><p><b>remat report</b>: <b>{html.escape(outcome(report, fb))}</b></p>",
             f"<table>{rows}</table>",
             "<p><b>By module</b> (activations recomputed and kept)</p>",
             table(["module", "recomputes", "frees", "keeps", "holds"], module_table(report))
             if report.by_module() else "<p>no activation recomputed or kept</p>",
             "<p><b>Largest kept activations</b></p>",
             table(["module", "value", "op", "size", "source", "reason", "node"], top_holders(report))
             if report.saved else "<p>none</p>",
             "<p><b>Recomputed, by op type</b></p>",
             table(["op type", "values", "bytes freed", "recompute time"], recomputed_by_category(report))
             if report.recomputed else "<p>nothing recomputed</p>"]
    parts += [f"<p>note: {html.escape(n)}</p>" for n in report.notes]
    return "".join(parts) + "</div>"


def report_page(report: Report) -> str:
    """The card as a whole HTML page (``Report.to_html``)."""
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>remat report</title></head>"
            f"<body>{report_html(report)}</body></html>\n")
