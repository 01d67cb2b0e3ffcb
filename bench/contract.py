"""The budget contract measured on the CPU: measured peak against the budget and the compiled account.

    python -m bench.contract                       # every bench model under Inductor, five budgets
    python -m bench.contract --models gpt convnet --compilers inductor eager
    python -m bench.contract --buffer-reuse        # Inductor's buffer reuse on for remat's graphs

For each model and compiler, at budgets 0, 25, 50, 75 and 100 % of the way from
the smallest feasible budget (``remat.plan``'s, exact) to the one at which
keeping everything fits: the CPU profiler's peak during a compiled step plus
the graph's inputs, the budget, remat's FX-level prediction and, under
Inductor, the peak of the program Inductor generated (``compiled_peak_bytes``).
Per model: the smallest feasible budget against the lowest measured peak.
Results go to bench/results/<date>-cpu-contract.{json,md} (``-buffer-reuse`` added with that flag).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib

import torch

import remat
from bench import hf_models
from remat.errors import GIB
from remat.measure import budget_peak
from remat.passes import torch_adapter as adapter
from remat.zoo import build as build_zoo

HF = {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "vocab": 256, "batch": 4}
SIZES = {"gpt": {"batch": 8, "seq": 64}, "gpt-softmax": {"batch": 8, "seq": 64}, "llama": {"batch": 8, "seq": 64},
         "convnet": {"batch": 8}, "vit": {"batch": 8}, "mlp-dropout": {"batch": 64},
         "hf-gpt2": HF, "hf-llama": HF, "hf-bert": HF}
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def build(name: str) -> tuple[torch.nn.Module, tuple]:
    if name.startswith("hf-"):
        return hf_models.build(name, **SIZES[name])
    return build_zoo(name, **SIZES.get(name, {}))


def measure_model(name: str, compiler: str) -> list[dict]:
    """One row per budget fraction."""
    model, inputs = build(name)
    adapter.reset_compiled()
    top = remat.plan(model, *inputs, compiler=compiler, plan_cache=False)
    rows = []
    for fraction in FRACTIONS:
        adapter.reset_compiled()
        compiled = remat.compile(model, budget_gb=top.budget_at(fraction) / GIB, compiler=compiler, plan_cache=False)
        compiled(*inputs).backward()  # compiles outside the measured step
        model.zero_grad(set_to_none=True)
        # as the budget counts a step: the model's parameters and buffers (HF Llama's original_inv_freq,
        # which no graph reads, included) and the inputs held, plus what the step allocates
        measured = budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cpu")
        model.zero_grad(set_to_none=True)
        rep = remat.reports(compiled)[0]
        rows.append({"model": name, "compiler": compiler, "fraction": fraction, "budget_bytes": rep.budget_bytes,
                     "predicted_peak_bytes": rep.predicted_peak_bytes, "compiled_peak_bytes": rep.compiled_peak_bytes,
                     "measured_peak_bytes": measured, "checked_over_measured": round(rep.checked_peak_bytes / measured, 4),
                     "within_budget": measured <= rep.budget_bytes, "compile_attempts": rep.compile_attempts,
                     "min_feasible_bytes": top.min_feasible_bytes})
    lowest = min(r["measured_peak_bytes"] for r in rows)
    for r in rows:
        r["min_feasible_over_lowest_measured"] = round(top.min_feasible_bytes / lowest, 4)
    return rows


def markdown(rows: list[dict]) -> str:
    out = ("| model | compiler | fraction | budget B | predicted B | compiled B | measured B | checked / measured "
           "| within budget | attempts | smallest feasible / lowest measured |\n")
    out += "|---|---|---|---|---|---|---|---|---|---|---|\n"
    return out + "".join(
        f"| {r['model']} | {r['compiler']} | {r['fraction']} | {r['budget_bytes']} | {r['predicted_peak_bytes']} "
        f"| {r['compiled_peak_bytes'] or ''} | {r['measured_peak_bytes']} | {r['checked_over_measured']} "
        f"| {r['within_budget']} | {r['compile_attempts']} | {r['min_feasible_over_lowest_measured']} |\n"
        for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.contract", description=__doc__.splitlines()[0])
    default = [m for m in SIZES if not m.startswith("hf-") or m in hf_models.names()]
    parser.add_argument("--models", nargs="+", default=default)
    parser.add_argument("--compilers", nargs="+", default=["inductor"])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--buffer-reuse", action="store_true",
                        help="compile remat's graphs with Inductor's buffer reuse on (remat keeps it off)")
    args = parser.parse_args(argv)
    adapter.INDUCTOR_SETTINGS["allow_buffer_reuse"] = args.buffer_reuse
    rows = []
    for name in args.models:
        for compiler in args.compilers:
            rows += measure_model(name, compiler)
            print(markdown(rows[-len(FRACTIONS):]), flush=True)
    today = dt.date.today().isoformat()
    command = f"python -m bench.contract --models {' '.join(args.models)} --compilers {' '.join(args.compilers)}"
    command += " --buffer-reuse" if args.buffer_reuse else ""
    stem = f"{today}-cpu-contract" + ("-buffer-reuse" if args.buffer_reuse else "")
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "sizes": SIZES, "command": command}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (out / f"{stem}.md").write_text(
        f"# Budget contract on the CPU, {today}, torch {torch.__version__}\n\nCommand: `{command}`\n\n"
        f"Bytes. *checked* is the compiled program's peak under Inductor, the model's op by op.\n\n{markdown(rows)}")
    print(markdown(rows))


if __name__ == "__main__":
    main()
