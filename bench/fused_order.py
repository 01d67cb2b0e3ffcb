"""Inductor's kernel order against the plan's: each model planned with remat's scheduling rules and without.

    python -m bench.fused_order                       # gpt gpt-softmax llama vit convnet, the bench's CPU sizes
    python -m bench.fused_order --models gpt

remat compiles its graphs with two rules (``passes/torch_adapter/inductor_order.py``):
``FusedAtLastPart``, each fused kernel runs where its last part was, not its first; and
``LocalFusion``, no fusion spans an extern kernel. For each model, in one
process (one profile: every variant plans with the same measured costs), this records the
smallest feasible budget under Inductor and, at 0, 25 and 50 % of the way from it to store-all,
the predicted and compiled peaks: with Inductor's order and fusions, with the pass alone, and
with both (remat's default).
Writes <date>-cpu-fused-order.{json,md}, rewritten after each model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
from unittest import mock

import torch

import remat
from bench.models import SIZES, build
from remat.errors import GIB
from remat.passes import torch_adapter as adapter
from remat.passes.torch_adapter.inductor_order import order_settings

MODELS = ("gpt", "gpt-softmax", "llama", "vit", "convnet")
FRACTIONS = (0.0, 0.25, 0.5)
MIB = 2**20


def planned(model: torch.nn.Module, inputs: tuple) -> dict:
    """The smallest feasible budget and the (predicted, compiled) peaks at each fraction."""
    adapter.reset_compiled()
    top = remat.plan(model, *inputs, plan_cache=False)
    row = {"min_feasible_bytes": top.min_feasible_bytes, "no_budget_compiled_bytes": top.compiled_peak_bytes}
    for fraction in FRACTIONS:
        adapter.reset_compiled()
        budget = top.budget_at(fraction)
        report = remat.plan(model, *inputs, budget_gb=budget / GIB, plan_cache=False)
        row[f"at_{fraction}"] = {"budget_bytes": budget, "predicted_bytes": report.predicted_peak_bytes,
                                 "compiled_bytes": report.compiled_peak_bytes}
    return row


VARIANTS = ("inductor_order", "last_part", "last_part_local_fusion")


def compare(name: str) -> dict:
    model, inputs = build(name, "cpu", SIZES["cpu"][name])
    row = {"model": name}
    with mock.patch.object(adapter, "INDUCTOR_CHOICES", None):
        with mock.patch.dict(adapter.INDUCTOR_SETTINGS, {setting: None for setting in order_settings()}):
            row["inductor_order"] = planned(model, inputs)
        row["last_part"] = planned(model, inputs)
    row["last_part_local_fusion"] = planned(model, inputs)
    return row


def lowest_compiled(row: dict) -> int:
    return min(row[f"at_{f}"]["compiled_bytes"] for f in FRACTIONS)


def markdown(rows: list[dict]) -> str:
    head = ("| model | order | smallest feasible MiB | lowest compiled MiB | predicted / compiled at 0 % | at 25 % "
            "| at 50 % |\n|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        for order in VARIANTS:
            v = r[order]
            cells = [f"{v[f'at_{f}']['predicted_bytes'] / MIB:.2f} / {v[f'at_{f}']['compiled_bytes'] / MIB:.2f}"
                     for f in FRACTIONS]
            lines.append(f"| {r['model']} | {order.replace('_', ' ')} | {v['min_feasible_bytes'] / MIB:.2f} "
                         f"| {lowest_compiled(v) / MIB:.2f} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def write(out: pathlib.Path, rows: list[dict], command: str) -> None:
    today = dt.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "threads": torch.get_num_threads(),
            "sizes": {r["model"]: SIZES["cpu"][r["model"]] for r in rows}, "command": command}
    (out / f"{today}-cpu-fused-order.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    text = (f"# Fused kernels at their last part or their first, local fusion: CPU, {today}, torch {torch.__version__}\n\n"
            f"Command: `{command}`\n\nOne process per model, one profile for every variant; Inductor; "
            "the bench's CPU sizes. Budgets are fractions of the way from each variant's own smallest "
            "feasible budget to store-all. Variants: Inductor's order and fusions; the last-part pass "
            "alone; the pass and no fusion across an extern kernel (remat's default).\n\n" + markdown(rows))
    (out / f"{today}-cpu-fused-order.md").write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fused_order", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    command = f"python -m bench.fused_order --models {' '.join(args.models)}"
    rows = []
    for name in args.models:
        rows.append(compare(name))
        write(pathlib.Path(args.out), rows, command)
        print(markdown(rows[-1:]), flush=True)


if __name__ == "__main__":
    main()
