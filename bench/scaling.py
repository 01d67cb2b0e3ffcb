"""Solver scaling: plan GPT-style models of growing depth on this machine's CPU.

    python -m bench.scaling                      # 2, 12 and 48 layers, d=256, seq 128
    python -m bench.scaling --layers 2 12 --out bench/results

Records, per depth: joint-graph steps, keep/recompute candidates, profiling
seconds (the first plan of each depth; ops already timed at a smaller depth
come from the per-process cost cache), the ILP's solve seconds, status and
gap at a binding budget (half way between the smallest feasible and
store-all), the smallest-peak solve, and torch's own min-cut decision time
on the same graph.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import platform

import torch

import remat
from bench.models import build
from remat.errors import GIB

SIZE = {"d_model": 256, "heads": 8, "seq": 128, "vocab": 1024, "batch": 8}


def plan_depth(layers: int, compiler: str) -> dict:
    model, inputs = build("gpt", layers=layers, **SIZE)
    top = remat.plan(model, *inputs, compiler=compiler)
    budget = (top.min_feasible_bytes + 0.5 * (top.store_all_peak_bytes / (1 - top.headroom) - top.min_feasible_bytes))
    rep = remat.plan(model, *inputs, compiler=compiler, budget_gb=budget / GIB)
    return {
        "layers": layers, "joint_graph_steps": rep.joint_graph_steps, "candidates": rep.candidates,
        "profile_seconds": round(top.profile_seconds, 3), "solve_seconds": round(rep.solve_seconds, 3),
        "solver_status": rep.solver_status, "mip_gap": rep.mip_gap,
        "min_feasible_solve_seconds": round(rep.min_feasible_solve_seconds, 3),
        "min_cut_seconds": round(rep.min_cut_seconds, 3),
        "budget_bytes": rep.budget_bytes, "predicted_peak_bytes": rep.predicted_peak_bytes,
        "store_all_peak_bytes": rep.store_all_peak_bytes, "min_feasible_bytes": rep.min_feasible_bytes,
        "predicted_overhead_ms": round(rep.predicted_overhead_seconds * 1e3, 3),
    }


def markdown(rows: list[dict]) -> str:
    head = ("| layers | steps | candidates | profile s | ILP solve s | status | gap | min-peak solve s "
            "| torch min-cut s |\n|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['layers']} | {r['joint_graph_steps']} | {r['candidates']} | {r['profile_seconds']} "
        f"| {r['solve_seconds']} | {r['solver_status']} | {r['mip_gap']} | {r['min_feasible_solve_seconds']} "
        f"| {r['min_cut_seconds']} |\n" for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 12, 48])
    parser.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    rows = []
    for layers in args.layers:
        rows.append(plan_depth(layers, args.compiler))
        print(json.dumps(rows[-1]), flush=True)
    today = dt.date.today().isoformat()
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "size": SIZE, "compiler": args.compiler,
            "command": "python -m bench.scaling " + " ".join(f"--layers {' '.join(map(str, args.layers))}".split())}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{today}-cpu-scaling.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (out / f"{today}-cpu-scaling.md").write_text(
        f"# Solver scaling, {today}, CPU ({meta['threads']} threads), torch {meta['torch']}\n\n"
        f"Command: `{meta['command']}`\n\n" + markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
