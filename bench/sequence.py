"""Peak memory against sequence length: PyTorch's options beside remat's smallest feasible budget.

    python -m bench.sequence                                  # 4 models x seq 128..1024 on the CPU
    python -m bench.sequence --models gpt --seqs 128 256 --set layers=1 --budget-mb 40
    python -m bench.sequence --models gpt-softmax llama --seqs 256 1024 --set layers=2 --tag 2-layers

Per model and sequence length (the model built at ``--set``-style sizes): the peak of one training
step (CPU profiler, under the budget contract; one warm-up step, one measured) for eager store-all,
eager and compiled checkpoint per block and ``torch.compile``'s ``activation_memory_budget`` 0.5, 0.2
and 0.0 (dp), then remat's smallest feasible budget (``remat.plan``) and remat measured at that budget.
Then, under one budget (``--budget-mb``; default: eager checkpoint per block's peak on the first model
at the median length), the longest sequence each policy fits. A row that fails keeps its error.

Writes ``<date>-cpu-sequence[-TAG].{json,md,png}`` into ``--out`` (``-smoke-`` with ``--smoke``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from bench import pareto, peers
from bench.__main__ import build
from bench.render import write_cpu_results
from remat.cli import parse_overrides

MIB = 2**20
MODELS = ("gpt-softmax", "gpt", "llama", "hf-t5")
SEQS = (128, 256, 512, 1024)
# One layer (T5: an encoder and a decoder block): compiles set the run's length; at two, one cell took 4 minutes.
SIZE = {"layers": 1, "d_model": 128, "heads": 4, "batch": 2, "vocab": 512}
PEERS = ("eager store-all", "eager checkpoint per block", "compile checkpoint per block",
         "compile budget 0.5 (dp)", "compile budget 0.2 (dp)", "compile budget 0.0 (dp)")
BASE = "eager checkpoint per block"
REMAT = "remat at its smallest feasible budget"
POLICIES = (*PEERS, REMAT)
Row = dict[str, Any]


def size_of(name: str, seq: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """The model's size at ``seq``: :data:`SIZE`, Llama's MLP width about 8/3 of d_model, then ``overrides``."""
    size = {**SIZE, **overrides, "seq": seq}
    if name == "llama" and "hidden" not in size:
        size["hidden"] = 8 * round(size["d_model"] * 8 / 3 / 8)
    return size


def remat_smallest(model: torch.nn.Module, inputs: tuple, setup: pareto.Setup) -> pareto.Row:
    """remat's smallest feasible budget (``remat.plan``), then remat measured at that budget."""
    row = pareto.Row(REMAT, "remat")

    def go() -> pareto.Row:
        t0 = time.perf_counter()
        bounds = pareto.plan_bounds(model, inputs, setup)
        row.budget_bytes = bounds["min_feasible_bytes"]
        row.extra.update(plan_s=round(time.perf_counter() - t0, 1), plan_solve_seconds=bounds["plan_solve_seconds"],
                         store_all_peak_bytes=bounds["store_all_peak_bytes"])
        return pareto.remat_row(row, model, inputs, setup)

    return pareto.guarded(row, setup, go)


def timed(fn: Callable[..., pareto.Row], *args: Any) -> pareto.Row:
    """``fn(*args)`` with its wall seconds (compiles included) in the row's ``extra["wall_s"]``."""
    t0 = time.perf_counter()
    row = fn(*args)
    row.extra["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def measure_cell(name: str, seq: int, overrides: dict[str, Any], setup: pareto.Setup) -> list[Row]:
    """Every policy's row for model ``name`` at sequence length ``seq``."""
    size = size_of(name, seq, overrides)
    model, inputs = build(name, "cpu", size)
    rows = [timed(pareto.peer_row, p, model, inputs, setup) for p in peers.PEERS if p.name in PEERS]
    rows.append(timed(remat_smallest, model, inputs, setup))
    return [dataclasses.asdict(r) | {"within_budget": r.within_budget, "model": name, "seq": seq, "size": size}
            for r in rows]


def find(rows: list[Row], model: str, seq: int, policy: str) -> Row | None:
    return next((r for r in rows if (r["model"], r["seq"], r["policy"]) == (model, seq, policy)), None)


def fits(row: Row | None, budget: int) -> bool:
    """Measured within ``budget``; for remat also its smallest feasible budget at most ``budget``."""
    if row is None or row["status"] != "ok" or row["peak_bytes"] > budget:
        return False
    return row["kind"] == "peer" or row["budget_bytes"] <= budget


def longest(rows: list[Row], budget: int) -> dict[str, dict[str, int | None]]:
    """Per model and policy, the longest sequence measured whose row fits ``budget`` (None: none)."""
    out: dict[str, dict[str, int | None]] = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        seqs = sorted({r["seq"] for r in rows if r["model"] == model})
        out[model] = {p: max((s for s in seqs if fits(find(rows, model, s, p), budget)), default=None)
                      for p in POLICIES}
    return out


def default_budget(rows: list[Row], model: str, seqs: list[int]) -> int | None:
    """Eager checkpoint per block's measured peak on ``model`` at the median length (the lower of two)."""
    row = find(rows, model, sorted(seqs)[(len(seqs) - 1) // 2], BASE)
    return row["peak_bytes"] if row and row["status"] == "ok" else None


def cell(row: Row | None) -> str:
    """A table cell: the peak in MiB, or the row's status."""
    if row is None:
        return ""
    return f"{row['peak_bytes'] / MIB:.2f}" if row["status"] == "ok" else row["status"].split(":")[0]


def ratio(a: int | None, b: Row | None) -> str:
    return f"{a / b['peak_bytes']:.3f}" if a is not None and b is not None and b["status"] == "ok" else ""


def model_table(rows: list[Row], model: str) -> str:
    """Rows: sequence lengths; columns: each policy's peak, remat's budget and ratios to the base."""
    head = ("| seq | " + " | ".join(PEERS) + " | remat smallest feasible budget | remat measured (within) "
            f"| smallest feasible / {BASE} | remat measured / {BASE} |\n" + "|---" * (len(PEERS) + 5) + "|\n")
    body = ""
    for seq in sorted({r["seq"] for r in rows if r["model"] == model}):
        ours, base = find(rows, model, seq, REMAT), find(rows, model, seq, BASE)
        small = ours["budget_bytes"] if ours else None
        measured = ours["peak_bytes"] if ours and ours["status"] == "ok" else None
        within = {None: "", True: " (yes)", False: " (**no**)"}[ours["within_budget"] if ours else None]
        body += (f"| {seq} | " + " | ".join(cell(find(rows, model, seq, p)) for p in PEERS)
                 + f" | {'' if small is None else f'{small / MIB:.2f}'} | {cell(ours)}{within} "
                 f"| {ratio(small, base)} | {ratio(measured, base)} |\n")
    return head + body


def longest_table(table: dict[str, dict[str, int | None]]) -> str:
    head = "| model | " + " | ".join(POLICIES) + " |\n" + "|---" * (len(POLICIES) + 1) + "|\n"
    return head + "".join(f"| {m} | " + " | ".join("none" if s is None else str(s) for s in by.values()) + " |\n"
                          for m, by in table.items())


def errors(rows: list[Row]) -> str:
    bad = [r for r in rows if r["status"] not in ("ok", "infeasible")]
    return "".join(f"- {r['model']}, seq {r['seq']}, {r['policy']}: {r['status']}\n" for r in bad) or "none\n"


def markdown(rows: list[Row], budget: int | None, size: dict[str, Any]) -> str:
    text = (f"Size: `{json.dumps(size)}`, float32. Peaks in MiB: one training step under the budget contract (CPU "
            "profiler) after one warm-up step. *remat smallest feasible budget*: `remat.plan`'s; *remat measured*: "
            "remat compiled at that budget (within it?).\n")
    for model in dict.fromkeys(r["model"] for r in rows):
        text += f"\n## {model}\n\n{model_table(rows, model)}"
    if budget is not None:
        text += (f"\n## Longest sequence under {budget / MIB:.2f} MiB\n\nMeasured peak at most the budget; for "
                 f"remat also its smallest feasible budget.\n\n{longest_table(longest(rows, budget))}")
    return text + f"\n## Rows that failed\n\n{errors(rows)}"


def plot(path: pathlib.Path, rows: list[Row], budget: int | None) -> None:
    """Peak against sequence length, a line per policy, a panel per model."""
    import matplotlib.pyplot as plt

    plt.switch_backend("Agg")

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for i, policy in enumerate(POLICIES):
            pts = [(r["seq"], r["peak_bytes"] / MIB) for r in rows
                   if (r["model"], r["policy"], r["status"]) == (model, policy, "ok")]
            style = {"color": "k", "lw": 2.5} if policy == REMAT else {"color": plt.cm.tab10(i)}
            if pts:
                ax.plot(*zip(*sorted(pts)), marker="o", label=policy, **style)
        if budget is not None:
            ax.axhline(budget / MIB, color="grey", ls="--", label="budget")
        ax.set(xscale="log", yscale="log", title=model, xlabel="sequence length", ylabel="peak MiB (log)")
        ax.set_xticks(seqs := sorted({r["seq"] for r in rows if r["model"] == model}), [str(s) for s in seqs])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cpu_name() -> str:
    info = pathlib.Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())


def write(out: pathlib.Path, name: str, rows: list[Row], info: dict[str, Any]) -> None:
    """The json (rows, meta with the CPU, budget and longest table), md and png; rewritten per cell."""
    budget = info["budget_bytes"]
    path = write_cpu_results(out, name, rows, info["command"], "Peak memory against sequence length",
                             markdown(rows, budget, info["size"]),
                             meta={"cpu": cpu_name(), "threads": torch.get_num_threads(), **info},
                             extra={"longest": None if budget is None else longest(rows, budget)})
    plot(path.with_suffix(".png"), rows, budget)


def main(argv: list[str] | None = None) -> list[Row]:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench.sequence", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--seqs", nargs="+", type=int, default=list(SEQS))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help=f"override a size field of every model (defaults {SIZE})")
    parser.add_argument("--budget-mb", type=float, default=None,
                        help=f"budget for the longest-sequence table (default: {BASE}'s peak, first model, median seq)")
    parser.add_argument("--smoke", action="store_true",
                        help="peers through aot_eager_decomp_partition, remat with compiler eager: checks the harness")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="", help="a suffix of the result files' names (a run at other sizes)")
    args = parser.parse_args(argv)
    fast = {"backend": "aot_eager_decomp_partition", "compiler": "eager"} if args.smoke else {}
    setup = pareto.Setup(device="cpu", warmup=1, steps=1, **fast)
    overrides = parse_overrides(args.set)
    info = {"command": f"python -m bench.sequence {shlex.join(argv)}".strip(), "size": {**SIZE, **overrides},
            "setup": dataclasses.asdict(setup) | {"deadline": None},
            "env": {k: os.environ.get(k) for k in ("REMAT_PLAN_CACHE", "REMAT_COST_CACHE")},
            "budget_bytes": None if args.budget_mb is None else int(args.budget_mb * MIB)}
    name = ("smoke-" if args.smoke else "") + "sequence" + (f"-{args.tag}" if args.tag else "")
    out, rows = pathlib.Path(args.out), []
    for model in args.models:
        for seq in args.seqs:
            rows += measure_cell(model, seq, overrides, setup)
            for r in rows[-len(POLICIES):]:
                print(f"{model} seq {seq}: {r['policy']}: {cell(r)}", flush=True)
            if info["budget_bytes"] is None and model == args.models[0]:
                info["budget_bytes"] = default_budget(rows, model, args.seqs)
            write(out, name, rows, info)  # after each cell: a run cut short keeps what it measured
    print(markdown(rows, info["budget_bytes"], info["size"]))
    return rows


if __name__ == "__main__":
    main()
