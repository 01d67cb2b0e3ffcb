"""Solver scaling: plan GPT-style models of growing depth on this machine's CPU.

    python -m bench.scaling                      # 2 to 96 layers, d=256, seq 128
    python -m bench.scaling --layers 2 12 --out bench/results
    python -m bench --scaling                    # the same, from the bench entry point

Records, per depth: joint-graph steps, keep/recompute candidates, profiling
seconds (the first plan of each depth; ops already timed at a smaller depth
come from the per-process cost cache), the ILP's solve seconds, status and
gap at a binding budget (half way between the smallest feasible and
store-all), the smallest-peak solve, and torch's own min-cut decision time
on the same graph. Under Inductor the report's solve seconds add up every plan the fitting loop
made; the solver is therefore also timed alone on the planned graph's Problem: one solve at the
binding budget and one smallest-peak solve. Writes <date>-cpu-scaling.{json,md,png}; the markdown
checks the targets on the solver alone (the binding-budget solve plus the smallest-peak solve: 12
layers in at most 5 s, 48 in at most 30 s, 96 in at most 60 s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import platform
import time

import torch

import remat
from remat.backend import RematBackend
from remat.errors import GIB
from remat.options import Options
from remat.solvers.plan import Once, Request, smallest_peak, solve
from remat.solvers.problem import Problem
from remat.zoo import build

SIZE = {"d_model": 256, "heads": 8, "seq": 128, "vocab": 1024, "batch": 8}
DEPTHS = (2, 4, 8, 12, 24, 48, 96)
TARGETS = {12: 5.0, 48: 30.0, 96: 60.0}  # layers: most seconds of the ILP solve plus the smallest-peak solve
MAX_GAP = 0.01  # the plan at the budget proved within this of the optimum


def plan_depth(layers: int, compiler: str) -> dict:
    model, inputs = build("gpt", layers=layers, **SIZE)
    top, problem = planned(model, inputs, compiler)
    budget = top.budget_at(0.5)
    rep = remat.plan(model, *inputs, compiler=compiler, budget_gb=budget / GIB)
    return {
        **solver_alone(problem, budget),
        "layers": layers, "joint_graph_steps": rep.joint_graph_steps, "candidates": rep.candidates,
        "profile_seconds": round(top.profile_seconds, 3), "solve_seconds": round(rep.solve_seconds, 3),
        "solver_status": rep.solver_status, "mip_gap": rep.mip_gap,
        "min_feasible_solve_seconds": round(rep.min_feasible_solve_seconds, 3),
        "min_cut_seconds": round(rep.min_cut_seconds, 3), "compile_attempts": rep.compile_attempts,
        "budget_bytes": rep.budget_bytes, "predicted_peak_bytes": rep.predicted_peak_bytes,
        "store_all_peak_bytes": rep.store_all_peak_bytes, "min_feasible_bytes": rep.min_feasible_bytes,
        "predicted_overhead_ms": round(rep.predicted_overhead_seconds * 1e3, 3),
    }


def planned(model: torch.nn.Module, inputs: tuple, compiler: str) -> tuple[remat.Report, Problem]:
    """``remat.plan(model, *inputs)`` without a budget, and the Problem its plan solved."""
    backend = RematBackend(Options(compiler=compiler), stop_after_plan=True)
    try:
        torch.compile(model, backend=backend)(*inputs)
    except Exception:  # capture stops once the plan is made (remat.plan does the same)
        if not backend.reports:
            raise
    return backend.reports[0], backend.plans[0].problem


def solver_alone(problem: Problem, budget: int) -> dict:
    """The solver timed alone on ``problem``: the smallest-peak solve, then one solve at ``budget``
    (given that smallest peak, as the planner has it by then)."""
    request = Request(budget, None, "ilp", 30.0)
    start = time.perf_counter()
    lowest = smallest_peak(problem, request.smallest_peak_config)
    middle = time.perf_counter()
    plan, _ = solve(problem, request, Once(lambda: lowest))
    return {"alone_min_peak_seconds": round(middle - start, 3), "alone_solve_seconds": round(time.perf_counter() - middle, 3),
            "alone_status": plan.status.value, "alone_gap": plan.gap}


def gap(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"


def markdown(rows: list[dict]) -> str:
    head = ("| layers | joint-graph nodes | candidates | profile s | solver alone: ILP solve s | status | gap "
            "| solver alone: min-peak solve s | report: solve s (every fitting attempt) | attempts | report: min-peak s "
            "| torch min-cut s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['layers']} | {r['joint_graph_steps']} | {r['candidates']} | {r['profile_seconds']} "
        f"| {r['alone_solve_seconds']} | {r['alone_status']} | {gap(r['alone_gap'])} | {r['alone_min_peak_seconds']} "
        f"| {r['solve_seconds']} | {r['compile_attempts']} | {r['min_feasible_solve_seconds']} "
        f"| {r['min_cut_seconds']} |\n" for r in rows)


def targets(rows: list[dict]) -> str:
    """Whether each depth with a target solved within it (the binding-budget solve plus the smallest-peak one)."""
    out = ""
    for r in rows:
        limit = TARGETS.get(r["layers"])
        if limit is not None:
            total = r["alone_solve_seconds"] + r["alone_min_peak_seconds"]
            proved = r["alone_gap"] is None or r["alone_gap"] <= MAX_GAP
            met = "yes" if total <= limit and proved else "**no**"
            out += (f"- {r['layers']} layers: ILP solve {r['alone_solve_seconds']} s + smallest-peak solve "
                    f"{r['alone_min_peak_seconds']} s = {total:.3f} s (solver alone), gap {gap(r['alone_gap'])}; "
                    f"target <= {limit:g} s with a gap <= {MAX_GAP:.0%}: {met}\n")
    return out


def plot(path: pathlib.Path, rows: list[dict], title: str) -> None:
    """Solve seconds against joint-graph steps: remat's ILP, its smallest-peak solve, torch's min-cut."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["joint_graph_steps"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.plot(steps, [r["alone_solve_seconds"] for r in rows], "o-", label="remat ILP, binding budget")
    ax.plot(steps, [r["alone_min_peak_seconds"] for r in rows], "s--", label="remat smallest-peak solve")
    ax.plot(steps, [r["min_cut_seconds"] for r in rows], "^:", label="torch min-cut decision")
    for r, x in zip(rows, steps):
        ax.annotate(f"{r['layers']}L", (x, r["alone_solve_seconds"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("joint-graph steps (nodes)")
    ax.set_ylabel("seconds")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: pathlib.Path, rows: list[dict], args: argparse.Namespace) -> None:
    """<date>-cpu-scaling.{json,md,png} for the depths measured so far."""
    today = dt.date.today().isoformat()
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "size": SIZE, "compiler": args.compiler,
            "command": "python -m bench.scaling " + " ".join(f"--layers {' '.join(map(str, args.layers))}".split())}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{today}-cpu-scaling.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    title = f"Solver scaling, {today}, CPU ({meta['threads']} threads), torch {meta['torch']}"
    plot(out / f"{today}-cpu-scaling.png", rows, title)
    done = "" if len(rows) == len(args.layers) else f" Measured so far: {len(rows)} of {len(args.layers)} depths."
    (out / f"{today}-cpu-scaling.md").write_text(
        f"# {title}\n\nCommand: `{meta['command']}`\n\nGPT-style, {json.dumps(SIZE)}; planned for "
        f"{args.compiler}. Times are wall clock on a shared machine.{done}\n\n" + markdown(rows)
        + "\n" + targets(rows) + f"\n![solver scaling]({today}-cpu-scaling.png)\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    rows = []
    for layers in args.layers:  # the files are rewritten after each depth: a cut-short run keeps what it measured
        rows.append(plan_depth(layers, args.compiler))
        print(json.dumps(rows[-1]), flush=True)
        write(pathlib.Path(args.out), rows, args)
    print(markdown(rows))


if __name__ == "__main__":
    main()
