"""The budget contract measured on the CPU: peak against budget and prediction.

    python -m bench.contract                     # gpt, llama, convnet; eager and inductor
    python -m bench.contract --models gpt --compilers inductor

For each model and compiler, at budgets 5 % and 50 % of the way from the
smallest feasible budget to the one at which keeping everything fits: the
CPU profiler's peak during a compiled step plus the graph's inputs, the
budget, and remat's prediction. Results go to
bench/results/<date>-cpu-contract.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib

import torch

import remat
from remat.errors import GIB
from remat.measure import cpu_step_peak, tensor_bytes
from remat.passes import torch_adapter as adapter
from remat.zoo import build

SIZES = {"gpt": {"batch": 8, "seq": 64}, "llama": {"batch": 8, "seq": 64}, "convnet": {"batch": 8}}
FRACTIONS = (0.05, 0.5)


def measure(name: str, compiler: str, fraction: float) -> dict:
    model, inputs = build(name, **SIZES.get(name, {}))
    top = remat.plan(model, *inputs, compiler=compiler)
    adapter.reset_compiled()
    compiled = remat.compile(model, budget_gb=top.budget_at(fraction) / GIB, compiler=compiler)
    compiled(*inputs).backward()  # compiles outside the measured step
    model.zero_grad(set_to_none=True)
    peak = cpu_step_peak(lambda: compiled(*inputs).backward())
    measured = peak + tensor_bytes([*model.parameters(), *model.buffers(), *inputs])
    rep = remat.reports(compiled)[0]
    return {"model": name, "compiler": compiler, "fraction": fraction, "budget_bytes": rep.budget_bytes,
            "predicted_peak_bytes": rep.predicted_peak_bytes, "measured_peak_bytes": measured,
            "measured_over_predicted": round(measured / rep.predicted_peak_bytes, 3),
            "within_budget": measured <= rep.budget_bytes}


def markdown(rows: list[dict]) -> str:
    out = "| model | compiler | fraction | budget B | predicted B | measured B | measured / predicted | within budget |\n"
    out += "|---|---|---|---|---|---|---|---|\n"
    return out + "".join(
        f"| {r['model']} | {r['compiler']} | {r['fraction']} | {r['budget_bytes']} | {r['predicted_peak_bytes']} "
        f"| {r['measured_peak_bytes']} | {r['measured_over_predicted']} | {r['within_budget']} |\n" for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.contract", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SIZES))
    parser.add_argument("--compilers", nargs="+", default=["eager", "inductor"])
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        for compiler in args.compilers:
            for fraction in FRACTIONS:
                rows.append(measure(name, compiler, fraction))
                print(json.dumps(rows[-1]), flush=True)
    today = dt.date.today().isoformat()
    command = f"python -m bench.contract --models {' '.join(args.models)} --compilers {' '.join(args.compilers)}"
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "sizes": SIZES, "command": command}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{today}-cpu-contract.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    table = markdown(rows)
    (out / f"{today}-cpu-contract.md").write_text(
        f"# Budget contract on the CPU, {today}, torch {torch.__version__}\n\nCommand: `{command}`\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
