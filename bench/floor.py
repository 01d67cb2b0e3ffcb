"""The floor of remat's plan space: the lowest peak any keep/recompute plan can have, proven.

    python -m bench.floor --models gpt gpt-softmax [--limit 120]

Per model (the CPU sizes of ``python -m bench``, planned for Inductor): the smallest-peak integer
program over the whole joint graph (every value decides for itself, MIP gap 0) gives a plan and a
proven lower bound on the predicted peak of *every* plan remat's program can express. A memory aim
below that bound cannot be met by choosing what to keep and recompute; it needs a change outside the
plan space (op order, gradient lifetimes, the memory model). Beside it: the parameter bytes (the
gradients of a step add as many) and the plan the smallest-feasible budget is made from.

Writes ``<date>-cpu-floor.{json,md}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from bench.__main__ import SIZES, build
from bench.render import write_cpu_results
from bench.scaling import planned
from remat.solvers.ilp import ILPConfig, min_peak

MIB = 2 ** 20


def floor_of(name: str, limit_s: float, size: dict | None = None, compiler: str = "inductor") -> dict:
    size = SIZES["cpu"][name] if size is None else size
    model, inputs = build(name, "cpu", size)
    top, problem = planned(model, inputs, compiler)
    lowest = min_peak(problem, config=ILPConfig(time_limit_s=limit_s, mip_gap=0.0))
    return {
        "model": name, "size": size, "compiler": compiler,
        "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "store_all_bytes": top.store_all_peak_bytes,
        "min_feasible_bytes": top.min_feasible_bytes,  # what remat accepts: the compiled smallest plan
        "floor_plan_bytes": lowest.peak_bytes,  # the min-peak plan found, predicted
        "floor_bound_bytes": lowest.bound,  # no plan of the program predicts a lower peak
        "status": lowest.status.value, "gap": lowest.gap, "solve_seconds": round(lowest.solve_seconds, 1),
    }


def markdown(rows: list[dict]) -> str:
    head = ("| model | parameters MiB | store-all MiB | smallest feasible budget MiB | min-peak plan MiB "
            "| proven floor MiB | status, gap | solve s |\n|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['model']} | {r['parameter_bytes'] / MIB:.2f} | {r['store_all_bytes'] / MIB:.2f} "
        f"| {r['min_feasible_bytes'] / MIB:.2f} | {r['floor_plan_bytes'] / MIB:.2f} "
        f"| {r['floor_bound_bytes'] / MIB:.2f} | {r['status']}, {r['gap']:.2%} | {r['solve_seconds']} |\n"
        for r in rows)


def write(out: pathlib.Path, rows: list[dict], command: str) -> None:
    write_cpu_results(out, "floor", rows, command, "The floor of remat's plan space",
                      "Predicted peaks in remat's memory model (planned for Inductor). *proven floor*: the "
                      "smallest-peak program's lower bound over every plan (no shared decisions); no "
                      "keep/recompute plan predicts less.\n\n" + markdown(rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt", "gpt-softmax"], choices=sorted(SIZES["cpu"]))
    parser.add_argument("--limit", type=float, default=120.0, help="seconds per smallest-peak solve")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    command = f"python -m bench.floor --models {' '.join(args.models)} --limit {args.limit:g}"
    rows = []
    for name in args.models:  # rewritten after each model: a cut-short run keeps what it solved
        rows.append(floor_of(name, args.limit))
        print(json.dumps(rows[-1]), flush=True)
        write(pathlib.Path(args.out), rows, command)
    print(markdown(rows))


if __name__ == "__main__":
    main()
