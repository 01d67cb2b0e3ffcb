"""How long remat takes to refuse a budget one byte below the smallest feasible one (Inductor).

    python -m bench.refusal --models gpt llama [--set layers=2 --set batch=2]

Per model (the CPU sizes of ``python -m bench`` unless ``--set`` overrides them; analytic costs, so
that every compile plans from the same costs): ``remat.plan`` names the smallest feasible budget,
then a budget one byte below it is compiled and refused twice, each in a process state of its own:

- *after remat.plan*: the programs ``remat.plan`` compiled are known (its smallest-peak plan's among
  them), as in a notebook that plans, then compiles;
- *fresh*: nothing of the model compiled before (``KNOWN.forget()``), as a script that only compiles.

Each row: the programs Inductor generated for the refusal, their peaks, and the wall seconds from the
first call to the ``BudgetError``. Writes ``<date>-cpu-refusal.{json,md}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any

import torch

import remat
from bench.__main__ import SIZES, build
from bench.render import write_cpu_results
from remat.cli import parse_overrides
from remat.errors import GIB
from remat.passes.program import fit
from remat.passes.program.known_programs import KNOWN

OPTIONS = {"profile": "analytic", "plan_cache": False}


def refused(model: torch.nn.Module, inputs: tuple, budget_bytes: int) -> dict[str, Any]:
    """Compile ``model`` at ``budget_bytes`` and run it until ``BudgetError``: the programs compiled."""
    peaks: list[int] = []
    compile_once = fit.compile_once

    def counted(*args: Any) -> Any:
        result = compile_once(*args)
        peaks.append(result[2])
        return result

    fit.compile_once = counted
    torch._dynamo.reset()
    t0 = time.perf_counter()
    try:
        remat.compile(model, budget_gb=budget_bytes / GIB, **OPTIONS)(*inputs)
    except remat.BudgetError as error:
        named, refused_bytes = error.min_feasible_bytes, error.budget_bytes
    else:
        raise AssertionError(f"a budget of {budget_bytes} bytes, below the smallest feasible, was accepted")
    finally:
        fit.compile_once = compile_once
    return {"programs": len(peaks), "program_peaks": peaks, "seconds": round(time.perf_counter() - t0, 1),
            "named_bytes": named, "budget_bytes": refused_bytes}


def refusal_of(name: str, size: dict[str, Any]) -> list[dict[str, Any]]:
    model, inputs = build(name, "cpu", size)
    torch._dynamo.reset()
    KNOWN.forget()
    t0 = time.perf_counter()
    low = remat.plan(model, *inputs, **OPTIONS).min_feasible_bytes
    planned_s = round(time.perf_counter() - t0, 1)
    rows = []
    for state in ("after remat.plan", "fresh"):
        if state == "fresh":
            KNOWN.forget()
        row = refused(model, inputs, low - 1)
        assert row["named_bytes"] == low, (name, state, row, low)
        rows.append({"model": name, "size": size, "state": state, "min_feasible_bytes": low,
                     "plan_seconds": planned_s, **row})
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| model | process state | smallest feasible B | programs compiled to refuse | their peaks B "
            "| seconds to refuse | remat.plan s |\n|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['model']} | {r['state']} | {r['min_feasible_bytes']} | {r['programs']} "
        f"| {', '.join(map(str, r['program_peaks']))} | {r['seconds']} | {r['plan_seconds']} |\n" for r in rows)


def write(out: pathlib.Path, rows: list[dict], command: str) -> None:
    write_cpu_results(out, "refusal", rows, command, "Refusing a budget one byte below the smallest feasible",
                      "Under Inductor, analytic costs. *after remat.plan*: the programs remat.plan compiled for "
                      "the smallest feasible budget are known to the process; *fresh*: none is. Seconds are "
                      "wall clock on a shared machine, from the first call to the BudgetError.\n\n" + markdown(rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.refusal", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt", "llama"], choices=sorted(SIZES["cpu"]))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a size field of every model (e.g. layers=2); recorded in the results")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    command = "python -m bench.refusal --models " + " ".join(args.models) + "".join(f" --set {p}" for p in args.set)
    rows: list[dict] = []
    for name in args.models:  # rewritten after each model: a cut-short run keeps what it measured
        rows += refusal_of(name, {**SIZES["cpu"][name], **parse_overrides(args.set)})
        write(pathlib.Path(args.out), rows, command)
    print(markdown(rows))


if __name__ == "__main__":
    main()
