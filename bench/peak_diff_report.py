"""The peak diff's report (``bench/peak_diff.py``), in markdown: the three peaks side by side, what
the compiled programs hold at their peak beyond eager checkpointing (grouped by role and module, the
largest excess first), then each live set in full, buffer by buffer.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from bench.peak_diff_live_set import MIB, TITLES, LiveSet, group_of


def grouped(live: LiveSet) -> dict[tuple[str, str], tuple[int, set[str]]]:
    """(role, module group) -> (bytes, ops): what a summary row compares."""
    out: dict[tuple[str, str], tuple[int, set[str]]] = defaultdict(lambda: (0, set()))
    for b in live.buffers:
        key = (b.role, group_of(b.module) if b.role not in ("held", "before", "scratch") else "")
        nbytes, ops = out[key]
        out[key] = (nbytes + b.bytes, ops | ({b.op} if b.op else set()))
    return dict(out)


def diff_rows(sets: dict[str, LiveSet]) -> list[dict[str, Any]]:
    """One row per (role, module group) that (b) or (c) holds more of at its peak than (a),
    the largest excess first."""
    groups = {p: grouped(s) for p, s in sets.items()}
    keys = sorted({k for g in groups.values() for k in g})
    rows = []
    for key in keys:
        sizes = {p: groups[p].get(key, (0, set()))[0] for p in sets}
        excess = max((sizes[p] - sizes.get("a", 0) for p in sets if p != "a"), default=0)
        if excess > 0:
            ops = sorted(set().union(*(groups[p].get(key, (0, set()))[1] for p in sets if p != "a")))
            rows.append({"role": key[0], "module": key[1], "bytes": sizes, "excess": excess, "ops": ops})
    return sorted(rows, key=lambda r: -r["excess"])


def mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.2f}"


def peaks_table(sets: dict[str, LiveSet]) -> str:
    lines = ["| program | measured peak MiB (budget_peak) | live set at the peak MiB | peak at |", "|---|---|---|---|"]
    for p, s in sets.items():
        lines.append(f"| {TITLES[p]} | {mib(s.measured_bytes)} | {mib(s.live_bytes)} | {s.peak_at} |")
    return "\n".join(lines) + "\n"


def diff_table(sets: dict[str, LiveSet]) -> str:
    others = [p for p in sets if p != "a"]
    head = "| role | module | " + " | ".join(f"({p}) MiB" for p in sets) + " | made by (ops, in " \
           + "/".join(f"({p})" for p in others) + ") |"
    lines = [head, "|" + "---|" * (3 + len(sets))]
    for r in diff_rows(sets):
        sizes = " | ".join(mib(r["bytes"][p]) for p in sets)
        lines.append(f"| {r['role']} | {r['module']} | {sizes} | {', '.join(r['ops'][:8])} |")
    totals = " | ".join(mib(s.live_bytes) for s in sets.values())
    lines.append(f"| **total** | | {totals} | |")
    return "\n".join(lines) + "\n"


def buffers_table(live: LiveSet) -> str:
    lines = ["| bytes | MiB | role | module | op | born | freed |", "|---|---|---|---|---|---|---|"]
    for b in sorted(live.buffers, key=lambda b: -b.bytes):
        lines.append(f"| {b.bytes} | {b.bytes / MIB:.3f} | {b.role} | {b.module} | {b.op} | {b.born} | {b.freed} |")
    return "\n".join(lines) + "\n"


def markdown(sets: dict[str, LiveSet], title: str, command: str, written: bool = False) -> str:
    """The report: peaks side by side, what (b)/(c) hold beyond (a), then each live set in full."""
    out = [f"# {title}\n\n", f"Command: `{command}`" + (" (with `--out`, this file)" if written else "") + "\n\n",
           "## The three peaks\n\n", peaks_table(sets),
           "\n## What the compiled programs hold at their peak beyond eager checkpointing\n\n",
           "Bytes alive at each program's own peak, by role and module (blocks starred); rows where (b) or (c) "
           "holds more than (a), the largest excess first.\n\n", diff_table(sets)]
    for p, s in sets.items():
        out.append(f"\n## {TITLES[p]}: {len(s.buffers)} buffers alive at the peak\n\n")
        out += [f"- {note}\n" for note in s.notes]
        out.append(("\n" if s.notes else "") + buffers_table(s))
    return "".join(out)
