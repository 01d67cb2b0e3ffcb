"""Monotone in fact: remat's budget sweep, measured, on each bench model.

    python -m bench.monotone                          # the contract's CPU models, 8 budgets each
    python -m bench.monotone --models gpt llama --points 8

For each model (``bench.contract``'s CPU sizes), ``remat.sweep(points=8, measure=True)`` under
Inductor: budgets from the smallest feasible to the one at which keeping everything fits, each
planned, compiled and run for one step; each budget then holds the fastest plan measured at any
budget that fits it (``remat.sweep``'s rule). Checks, budget by budget from the highest down:

- the checked peak (the compiled program's, under Inductor) never rises and the predicted added
  time never falls as the budget falls;
- the measured peak does not rise by more than 2 % as the budget falls (over the lowest measured
  at any larger budget);
- every measured peak is within its budget.

Writes <date>-cpu-monotone.{json,md} (rewritten after each model).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib

import torch

import remat
from bench import hf_models
from bench.contract import SIZES, build

RISE = 0.02  # the measured peak may rise this much as the budget falls (allocator and layout noise)


def sweep_model(name: str, points: int) -> list[dict]:
    """One row per budget, highest first, with the checks' verdicts."""
    model, inputs = build(name)
    frontier = remat.sweep(model, *inputs, points=points, measure=True)
    rows = [dict(r, model=name) for r in frontier.rows if r["feasible"]]
    rows.sort(key=lambda r: -r["budget_bytes"])
    return judged(rows)


def judged(rows: list[dict]) -> list[dict]:
    """Add ``monotone_prediction``, ``measured_rise`` (over the lowest measured peak at any larger
    budget) and ``within_budget`` to rows sorted by falling budget."""
    highest_peak, lowest_time, lowest_measured = None, None, None
    for r in rows:
        peak, seconds, measured = checked_peak(r), r["predicted_overhead_seconds"], r["measured_peak_bytes"]
        r["monotone_prediction"] = ((highest_peak is None or peak <= highest_peak)
                                    and (lowest_time is None or seconds >= lowest_time - 1e-12))
        r["measured_rise"] = (None if lowest_measured is None or measured is None
                              else round(measured / lowest_measured - 1, 4))
        r["within_budget"] = measured is not None and measured <= r["budget_bytes"]
        highest_peak = peak if highest_peak is None else min(highest_peak, peak)
        lowest_time = seconds if lowest_time is None else max(lowest_time, seconds)
        if measured is not None:
            lowest_measured = measured if lowest_measured is None else min(lowest_measured, measured)
    return rows


def checked_peak(row: dict) -> int:
    """The peak the budget is checked against: the compiled program's where there is one."""
    compiled = row.get("compiled_peak_bytes")
    return row["predicted_peak_bytes"] if compiled is None else compiled


def verdict(rows: list[dict]) -> dict[str, bool]:
    return {"predicted monotone": all(r["monotone_prediction"] for r in rows),
            f"measured rises at most {RISE:.0%}": all((r["measured_rise"] or 0) <= RISE for r in rows),
            "measured within budget": all(r["within_budget"] for r in rows)}


def markdown(rows: list[dict]) -> str:
    head = ("| model | budget B | plan's budget B | predicted peak B | compiled peak B | predicted added ms "
            "| measured peak B | own plan measured B | rise over larger budgets | monotone prediction | within budget |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['model']} | {r['budget_bytes']} | {r.get('plan_budget_bytes', '')} | {r['predicted_peak_bytes']} "
        f"| {r.get('compiled_peak_bytes') or ''} | {r['predicted_overhead_seconds'] * 1e3:.3f} "
        f"| {r['measured_peak_bytes']} | {r.get('own_plan_measured_peak_bytes', '')} | {rise(r)} "
        f"| {r['monotone_prediction']} | {r['within_budget']} |\n" for r in rows)
    return head + body


def rise(row: dict) -> str:
    return "" if row["measured_rise"] is None else f"{row['measured_rise']:+.2%}"


def write(out: pathlib.Path, by_model: dict[str, list[dict]], command: str) -> None:
    today = dt.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "threads": torch.get_num_threads(),
            "sizes": {m: SIZES[m] for m in by_model}, "command": command}
    (out / f"{today}-cpu-monotone.json").write_text(json.dumps({"meta": meta, "rows": by_model}, indent=2))
    lines = [f"# remat's sweep, measured: monotone in fact? CPU, {today}, torch {torch.__version__}\n",
             f"Command: `{command}`\n", "Bytes; budgets from the highest down; Inductor; the contract's sizes.\n"]
    for name, rows in by_model.items():
        checks = ", ".join(f"{k}: {'yes' if v else '**no**'}" for k, v in verdict(rows).items())
        lines += [f"## {name}\n", checks + "\n", markdown(rows)]
    (out / f"{today}-cpu-monotone.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.monotone", description=__doc__.splitlines()[0])
    default = [m for m in SIZES if not m.startswith("hf-") or m in hf_models.names()]
    parser.add_argument("--models", nargs="+", default=default)
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    command = f"python -m bench.monotone --models {' '.join(args.models)} --points {args.points}"
    by_model: dict[str, list[dict]] = {}
    for name in args.models:
        by_model[name] = sweep_model(name, args.points)
        print(f"{name}: {verdict(by_model[name])}", flush=True)
        write(pathlib.Path(args.out), by_model, command)


if __name__ == "__main__":
    main()
