"""Tables, target checks, summary lines and Pareto plots from :mod:`bench.pareto` rows (as dicts)."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import platform
from typing import Any

import torch

Row = dict[str, Any]
TOLERANCE = 0.05  # prediction within 5 % of the measured peak


def unit(rows: list[Row]) -> tuple[str, int]:
    """GiB when the largest peak is at least 1 GiB, else MiB."""
    top = max((r["peak_bytes"] or 0 for r in rows), default=0)
    return ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)


def ok(rows: list[Row], kind: str | None = None) -> list[Row]:
    return [r for r in rows if r["status"] == "ok" and (kind is None or r["kind"].startswith(kind))]


def find(rows: list[Row], policy: str) -> Row | None:
    return next((r for r in rows if r["policy"] == policy and r["status"] == "ok"), None)


def fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row]) -> str:
    """Every row: peak, reserved peak, step time, against compile default, budget and prediction."""
    name, size = unit(rows)
    base = find(rows, "compile default")
    head = (f"| policy | status | peak {name} | reserved {name} | step ms | time vs compile default "
            f"| compile s | budget {name} | predicted {name} | within budget | solve s |\n" + "|---" * 11 + "|\n")
    body = ""
    for r in rows:
        scaled = lambda key: None if r.get(key) is None else r[key] / size  # noqa: E731
        ratio = r["step_ms"] / base["step_ms"] if base and r["step_ms"] else None
        within = "" if r.get("within_budget") is None else ("yes" if r["within_budget"] else "**no**")
        shared = f" (= {r['shared_with']})" if r.get("shared_with") else ""
        status = r["status"]
        if status == "infeasible" and r.get("min_feasible_bytes"):
            status += f" (smallest {r['min_feasible_bytes'] / size:.3f})"
        body += (f"| {r['policy']}{shared} | {status} | {fmt(scaled('peak_bytes'), 3)} "
                 f"| {fmt(scaled('reserved_peak_bytes'), 3)} | {fmt(r['step_ms'])} | {fmt(ratio, 3)} "
                 f"| {fmt(r['compile_s'])} | {fmt(scaled('budget_bytes'), 3)} "
                 f"| {fmt(scaled('predicted_peak_bytes'), 3)} "
                 f"| {within} | {fmt(r['solve_seconds'], 3)} |\n")
    return head + body


# The peers whose rule remat's model states (Report.peer_rules, and torch's min-cut plan).
RULE_OF_PEER = {"eager checkpoint per block": "checkpoint-blocks", "compile checkpoint per block": "checkpoint-blocks",
                "compile selective checkpoint (save matmuls)": "save-matmuls", "compile default": "torch-min-cut"}


def matched(rows: list[Row]) -> list[dict[str, Any]]:
    """Per peer: remat at that peer's measured peak, and remat's time and peak as ratios of the peer's;
    where remat's model states the peer's rule, both plans' predicted added time in that model."""
    out = []
    for peer in ok(rows, "peer"):
        twin = next((r for r in rows if r.get("matched_peer") == peer["policy"]), None)
        entry = {"peer": peer["policy"], "peer_peak_bytes": peer["peak_bytes"], "peer_step_ms": peer["step_ms"],
                 "remat_status": twin["status"] if twin else "missing"}
        if twin and twin["status"] == "ok":
            entry.update(remat_peak_bytes=twin["peak_bytes"], remat_step_ms=twin["step_ms"],
                         time_ratio=round(twin["step_ms"] / peer["step_ms"], 3),
                         peak_ratio=round(twin["peak_bytes"] / peer["peak_bytes"], 3))
            entry.update(model_comparison(peer, twin))
        out.append(entry)
    return out


def model_comparison(peer: Row, twin: Row) -> dict[str, Any]:
    """remat's predicted added ms at the peer's peak beside the peer's rule in remat's model, and
    whether that rule's predicted peak fits the same budget (then remat's is never slower)."""
    rule = (twin.get("extra", {}).get("peer_rules") or {}).get(RULE_OF_PEER.get(peer["policy"], ""))
    if not rule or rule.get("peak_bytes") is None or rule.get("overhead_seconds") is None:
        return {}
    return {"remat_model_ms": round(twin["extra"]["predicted_overhead_ms"], 3),
            "rule_model_ms": round(rule["overhead_seconds"] * 1e3, 3),
            "rule_fits": rule["peak_bytes"] <= twin["budget_bytes"]}


def matched_table(rows: list[Row]) -> str:
    name, size = unit(rows)
    head = (f"| peer | peer peak {name} | peer ms | remat peak {name} | remat ms | remat time / peer "
            "| remat peak / peer | predicted added ms in remat's model: remat, the peer's rule (fits?) |\n"
            "|---|---|---|---|---|---|---|---|\n")
    body = ""
    for m in matched(rows):
        if "time_ratio" not in m:
            body += (f"| {m['peer']} | {m['peer_peak_bytes'] / size:.3f} | {m['peer_step_ms']:.2f} "
                     f"| {m['remat_status']} | | | | |\n")
            continue
        model = (f"{m['remat_model_ms']:.3f}, {m['rule_model_ms']:.3f} ({'fits' if m['rule_fits'] else 'over'})"
                 if "rule_model_ms" in m else "")
        body += (f"| {m['peer']} | {m['peer_peak_bytes'] / size:.3f} | {m['peer_step_ms']:.2f} "
                 f"| {m['remat_peak_bytes'] / size:.3f} | {m['remat_step_ms']:.2f} | {m['time_ratio']:.3f} "
                 f"| {m['peak_ratio']:.3f} | {model} |\n")
    return head + body


def summary_line(model: str, rows: list[Row]) -> str:
    """One line: at each peer's peak, remat's step time as a ratio of the peer's."""
    parts = [f"{m['peer']} {m['time_ratio']:.2f}x" if "time_ratio" in m else f"{m['peer']} {m['remat_status']}"
             for m in matched(rows)]
    return f"{model}: remat time / peer time at each peer's measured peak: " + ", ".join(parts)


def monotone(rows: list[Row]) -> tuple[bool, list[str]]:
    """Do remat's own measurements (not shared ones) never peak higher at a lower budget?"""
    own = sorted((r for r in ok(rows, "remat") if r["budget_bytes"] and not r.get("shared_with")),
                 key=lambda r: r["budget_bytes"])
    bad = [f"{a['policy']} ({a['peak_bytes']} B at budget {a['budget_bytes']}) > {b['policy']} "
           f"({b['peak_bytes']} B at budget {b['budget_bytes']})"
           for a, b in zip(own, own[1:]) if a["peak_bytes"] > b["peak_bytes"]]
    return not bad, bad


def targets(model: str, rows: list[Row], *, sdpa: bool) -> list[dict[str, Any]]:
    """The issue's targets for this model, each met or missed with the numbers behind it."""
    out: list[dict[str, Any]] = []
    base = find(rows, "compile default")
    pairs = [m for m in matched(rows) if "time_ratio" in m]
    compiled = [m for m in matched(rows) if m["peer"].startswith("compile")]
    compiled_pairs = [m for m in compiled if "time_ratio" in m]
    if compiled:
        missing = [m["peer"] for m in compiled if "time_ratio" not in m]
        value = f"remat infeasible or failed at {len(missing)} of {len(compiled)} peaks"
        if compiled_pairs:
            worst = max(compiled_pairs, key=lambda m: m["time_ratio"])
            value += (f"; worst time ratio {worst['time_ratio']:.3f} (vs {worst['peer']}), "
                      f"highest peak ratio {max(m['peak_ratio'] for m in compiled_pairs):.3f}")
        out.append({"target": "at equal measured peak, remat faster than every torch.compile policy", "value": value,
                    "met": not missing and all(m["time_ratio"] < 1 and m["peak_ratio"] <= 1 for m in compiled_pairs)})
    block = next((m for m in pairs if m["peer"] == "compile checkpoint per block"), None)
    if block and base:
        overhead = block["remat_step_ms"] / base["step_ms"] - 1
        out.append({"target": "at the compile checkpoint-per-block peak, overhead over compile default <= 5 %",
                    "met": overhead <= 0.05, "value": f"{overhead:+.1%} (torch's checkpoint per block: "
                    f"{block['peer_step_ms'] / base['step_ms'] - 1:+.1%})"})
    elif base and find(rows, "compile checkpoint per block"):
        out.append({"target": "at the compile checkpoint-per-block peak, overhead over compile default <= 5 %",
                    "met": False, "value": "remat infeasible at that peak"})
    if sdpa and base:
        low = [r for r in ok(rows, "remat") if r["peak_bytes"] <= 0.45 * base["peak_bytes"]]
        best = min(low, key=lambda r: r["step_ms"], default=None)
        lowest = min(ok(rows, "remat"), key=lambda r: r["peak_bytes"], default=None)
        if best:
            value = (f"{best['policy']}: {best['peak_bytes'] / base['peak_bytes']:.3f}x peak, "
                     f"{best['step_ms'] / base['step_ms'] - 1:+.1%} time")
        elif lowest:
            value = f"lowest remat peak {lowest['peak_bytes'] / base['peak_bytes']:.3f}x the default's"
        else:
            value = "no rows"
        out.append({"target": "0.45x compile default's peak at <= 10 % overhead", "value": value,
                    "met": bool(best) and best["step_ms"] <= 1.10 * base["step_ms"]})
    modelled = [m for m in matched(rows) if m.get("rule_fits")]
    if modelled:
        slower = [m["peer"] for m in modelled if m["remat_model_ms"] > m["rule_model_ms"] + 1e-9]
        out.append({"target": "at each peer's peak, remat predicted no slower than the peer's rule in remat's model "
                              "(where that rule fits)", "met": not slower,
                    "value": f"{len(modelled) - len(slower)}/{len(modelled)} no slower"
                             + (f"; slower: {slower}" if slower else "")})
    budgeted = [r for r in ok(rows, "remat") if r["budget_bytes"]]
    over = [r["policy"] for r in budgeted if not r["within_budget"]]
    out.append({"target": "measured peak never over budget", "met": not over,
                "value": f"{len(budgeted) - len(over)}/{len(budgeted)} within" + (f"; over: {over}" if over else "")})
    errors = [r["peak_bytes"] / r["predicted_peak_bytes"] for r in ok(rows, "remat") if r["predicted_peak_bytes"]]
    if errors:
        out.append({"target": "prediction within 5 % of measured peak",
                    "met": all(abs(e - 1) <= TOLERANCE for e in errors),
                    "value": f"measured / predicted {min(errors):.3f} to {max(errors):.3f}"})
    mono, bad = monotone(rows)
    out.append({"target": "lower budget never higher measured peak", "met": mono, "value": "; ".join(bad) or "holds"})
    free = find(rows, "remat (no budget)")
    if free and base:
        out.append({"target": "remat without a budget at least as fast as compile default",
                    "met": free["step_ms"] <= base["step_ms"],
                    "value": f"{free['step_ms'] / base['step_ms']:.3f}x compile default's time"})
    return out


def targets_table(checks: list[dict[str, Any]]) -> str:
    return "| target | met | measured |\n|---|---|---|\n" + "".join(
        f"| {c['target']} | {'yes' if c['met'] else '**no**'} | {c['value']} |\n" for c in checks)


def plot(path: pathlib.Path, title: str, rows: list[Row]) -> None:
    """Peak against step time: a marker per peer, remat's rows as a line (lowest peak first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name, size = unit(rows)
    fig, ax = plt.subplots(figsize=(9, 6))
    markers = "osD^v<>pPX*hH8d"
    for i, r in enumerate(ok(rows, "peer")):
        ax.scatter(r["step_ms"], r["peak_bytes"] / size, marker=markers[i % len(markers)], s=60, label=r["policy"],
                   color=plt.cm.tab20(i % 20))
    own = sorted((r for r in ok(rows, "remat") if not r.get("shared_with")), key=lambda r: r["peak_bytes"])
    if own:
        ax.plot([r["step_ms"] for r in own], [r["peak_bytes"] / size for r in own], "k-", marker=".", lw=2,
                label="remat (sweep, matched budgets, no budget)")
    ax.set_xlabel("step time, ms (median)")
    ax.set_ylabel(f"peak under the budget contract, {name}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_cpu_results(out: pathlib.Path, name: str, rows: list[Row], command: str, title: str, text: str, *,
                      meta: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> pathlib.Path:
    """``<date>-cpu-<name>.json`` (rows and how they were made, with ``meta`` added to that and
    ``extra`` beside the rows) and ``.md`` (``title``, the command, then ``text``) in ``out``; the
    json's path."""
    today = dt.date.today().isoformat()
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "python": platform.python_version(),
            "command": command, **(meta or {})}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{today}-cpu-{name}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows, **(extra or {})}, indent=2))
    (out / f"{today}-cpu-{name}.md").write_text(f"# {title}, {today}, CPU, torch {meta['torch']}\n\n"
                                                f"Command: `{command}`\n\n{text}")
    return path
