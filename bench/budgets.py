"""GPT-style model at three budgets against torch.compile's default, side by side in one run.

    python -m bench.budgets                       # CUDA: 12 layers, d=1024, seq 2048, batch 8, bf16 autocast
    python -m bench.budgets --device cpu --smoke  # a small model on the CPU: the harness end to end

Per row: the measured peak under the budget contract (max allocated during
the step - allocated before it + the graph's inputs), remat's prediction and
budget, and the step time (median of ``--steps`` steps after warm-up; CUDA
events on GPU). Results go to bench/results/<date>-<device>-gpt-budgets.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import pathlib
import time
from collections.abc import Callable

import torch

import remat
from remat.cli import parse_overrides
from remat.errors import GIB, format_bytes
from remat.measure import budget_peak
from remat.passes import torch_adapter as adapter
from remat.passes.costs.timing import time_call
from remat.zoo import build

CUDA_SIZE = {"layers": 12, "d_model": 1024, "heads": 16, "seq": 2048, "vocab": 32000, "batch": 8}
SMOKE_SIZE = {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "vocab": 256, "batch": 4}
FRACTIONS = (0.8, 0.5, 0.2)


def autocast(device: str) -> contextlib.AbstractContextManager:
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def measure(name: str, model: torch.nn.Module, run: Callable, inputs: tuple, device: str, steps: int) -> dict:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast(device):
            loss = run(*inputs)
        loss.backward()

    t0 = time.perf_counter()
    step()  # compiles
    compile_s = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    peak = budget_peak(step, model, inputs, device)
    seconds = time_call(step, torch.device(device), steps)  # median after a warm-up step
    return {"policy": name, "peak_bytes": peak, "step_ms": seconds * 1e3,
            "compile_s": round(compile_s, 2)}


def run_all(device: str, size: dict, steps: int) -> list[dict]:
    model, inputs = build("gpt", device=device, **size)
    rows = [measure("torch.compile default", model, torch.compile(model), inputs, device, steps)]
    adapter.reset_compiled()
    with autocast(device):
        top = remat.plan(model, *inputs)
    for fraction in (None, *FRACTIONS):
        adapter.reset_compiled()
        budget_gb = None if fraction is None else top.budget_at(fraction) / GIB
        compiled = remat.compile(model, budget_gb=budget_gb)
        name = "remat, no budget" if fraction is None else f"remat at {fraction:.0%} from smallest to store-all"
        row = measure(name, model, compiled, inputs, device, steps)
        rep = remat.reports(compiled)[0]
        row.update(budget_bytes=rep.budget_bytes, predicted_peak_bytes=rep.predicted_peak_bytes,
                   compiled_peak_bytes=rep.compiled_peak_bytes,
                   compile_attempts=rep.compile_attempts, min_feasible_bytes=top.min_feasible_bytes,
                   solve_seconds=round(rep.solve_seconds, 3), within_budget=None if rep.budget_bytes is None else row["peak_bytes"] <= rep.budget_bytes)
        rows.append(row)
    base = rows[0]["step_ms"]
    for row in rows:
        row["time_vs_default"] = round(row["step_ms"] / base, 3)
    return rows


def ratio(measured: int, compiled: int | None) -> str:
    return "" if not compiled else f"{measured / compiled:.4f}"


def markdown(rows: list[dict]) -> str:
    out = ("| policy | measured peak | budget | predicted peak | compiled program's peak | measured / compiled "
           "| within budget | step ms | vs default | compile s |\n")
    out += "|---|---|---|---|---|---|---|---|---|---|\n"
    gib = lambda b: "" if b is None else format_bytes(b)  # noqa: E731
    for r in rows:
        out += (f"| {r['policy']} | {gib(r['peak_bytes'])} | {gib(r.get('budget_bytes'))} "
                f"| {gib(r.get('predicted_peak_bytes'))} | {gib(r.get('compiled_peak_bytes'))} "
                f"| {ratio(r['peak_bytes'], r.get('compiled_peak_bytes'))} | {'' if r.get('within_budget') is None else r['within_budget']} | {r['step_ms']:.1f} "
                f"| {r['time_vs_default']} | {r['compile_s']} |\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.budgets", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="a small model: checks the harness, not speed")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a size field (e.g. layers=4); recorded in the results")
    args = parser.parse_args(argv)
    size = {**(SMOKE_SIZE if args.smoke or args.device == "cpu" else CUDA_SIZE), **parse_overrides(args.set)}
    rows = run_all(args.device, size, args.steps)
    today = dt.date.today().isoformat()
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    command = (f"python -m bench.budgets --device {args.device}" + (" --smoke" if args.smoke else "")
               + "".join(f" --set {pair}" for pair in args.set))
    meta = {"date": today, "device": gpu, "torch": torch.__version__, "size": size, "command": command}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{today}-{args.device}{'-smoke' if args.smoke else ''}-gpt-budgets"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    table = markdown(rows)
    (out / f"{stem}.md").write_text(f"# GPT-style budgets, {today}, {gpu}, torch {torch.__version__}\n\n"
                                   f"Command: `{command}`\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
