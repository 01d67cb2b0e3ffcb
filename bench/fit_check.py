"""What ``remat.fit`` predicts on meta against what runs on the CPU, for every bench model.

    python -m bench.fit_check                             # every bench model, batch (and seq for transformers)
    python -m bench.fit_check --models gpt llama --compilers eager inductor

For each model and each size that can vary (the batch; the sequence length of the transformers), the
budget is the store-all peak at the model's usual size (what keeping everything needs there), so the
largest size that fits lies above it. ``remat.fit`` searches it on the meta device with CPU figures
(nothing allocated or run); then the model is built on the CPU at that size and at the next, compiled
under the same budget and trained two steps: the size found must run within the budget (steps 1 and 2
measured as the budget counts them) and the next one must be refused with ``BudgetError``.
Results go to bench/results/<date>-cpu-fit-check.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import time

import torch

import remat
from remat import zoo
from remat.errors import GIB
from remat.measure import budget_peak
from remat.passes import torch_adapter as adapter
from remat.solvers.errors import format_bytes

SIZES = {"gpt": {"batch": 8, "seq": 64}, "gpt-softmax": {"batch": 8, "seq": 64}, "llama": {"batch": 8, "seq": 64},
         "convnet": {"batch": 8}, "vit": {"batch": 8}, "mlp-dropout": {"batch": 64}}
SEQUENCE_MODELS = ("gpt", "gpt-softmax", "llama")


def build(name: str, vary: str, size: int, device: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The bench model at ``size`` on ``device`` (on meta, made there: nothing is allocated)."""
    with torch.device(device):
        return zoo.build(name, device=device, **{**SIZES[name], vary: size})


def steps_within(name: str, vary: str, size: int, budget_gb: float, compiler: str) -> tuple[bool | None, int]:
    """Whether two compiled steps at ``size`` run within the budget (None: refused), and their peak."""
    model, inputs = build(name, vary, size, "cpu")
    adapter.reset_compiled()
    compiled = remat.compile(model, budget_gb=budget_gb, compiler=compiler, plan_cache=False)
    peaks = []
    try:
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            peaks.append(budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cpu"))
    except remat.BudgetError:
        return None, 0
    return max(peaks) <= budget_gb * GIB, max(peaks)


def check(name: str, vary: str, compiler: str) -> dict:
    """One row: the size fit found on meta, and what ran on the CPU at it and at the next size."""
    usual = SIZES[name][vary]
    model, inputs = build(name, vary, usual, "meta")
    budget_gb = remat.plan(model, *inputs, device="cpu", compiler=compiler).store_all_peak_bytes / GIB
    t0 = time.perf_counter()
    found = remat.fit(lambda n: build(name, vary, n, "meta")[0], lambda n: build(name, vary, n, "meta")[1],
                      budget_gb=budget_gb, vary=vary, low=max(1, usual // 2), device="cpu", compiler=compiler)
    fit_seconds = time.perf_counter() - t0
    fits, peak = steps_within(name, vary, found.size, budget_gb, compiler)
    next_fits, _ = steps_within(name, vary, found.size + 1, budget_gb, compiler)
    return {"model": name, "vary": vary, "compiler": compiler, "budget_bytes": int(budget_gb * GIB),
            "usual": usual, "found": found.size, "sizes_tried": found.captured, "fit_seconds": round(fit_seconds, 1),
            "found_runs_within": fits, "found_measured_bytes": peak, "next_refused": next_fits is None,
            "agrees": bool(fits) and next_fits is None}


def to_markdown(rows: list[dict], command: str) -> str:
    lines = [f"# remat.fit on meta against the CPU ({dt.date.today()}, torch {torch.__version__})", "",
             f"Command: `{command}`", "",
             "Budget: the store-all peak at the usual size. *found*: the largest size `remat.fit` predicts on "
             "meta (CPU figures); *runs within*: two compiled CPU steps at that size measured within the budget; "
             "*next refused*: the size after it raised `BudgetError`.", "",
             "| model | vary | compiler | budget | usual | found | sizes tried | fit s | measured at found "
             "| runs within | next refused |", "|---|---|---|---:|---:|---:|---|---:|---:|:-:|:-:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['vary']} | {r['compiler']} | {format_bytes(r['budget_bytes'])} "
                     f"| {r['usual']} | {r['found']} | {r['sizes_tried']} | {r['fit_seconds']} "
                     f"| {format_bytes(r['found_measured_bytes']) if r['found_measured_bytes'] else '-'} "
                     f"| {'yes' if r['found_runs_within'] else 'refused' if r['found_runs_within'] is None else 'NO'} "
                     f"| {'yes' if r['next_refused'] else 'NO'} |")
    agree = sum(r["agrees"] for r in rows)
    lines += ["", f"{agree} of {len(rows)} rows agree (the size found runs within the budget and the next is refused)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--compilers", nargs="+", default=["eager", "inductor"], choices=["eager", "inductor"])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="", help="appended to the results' file name (a second run of one day)")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        for vary in ("batch", "seq") if name in SEQUENCE_MODELS else ("batch",):
            for compiler in args.compilers:
                rows.append(check(name, vary, compiler))
                print(json.dumps(rows[-1]), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{dt.date.today()}-cpu-fit-check{'-' + args.tag if args.tag else ''}"
    command = "python -m bench.fit_check " + " ".join(
        [f"--models {' '.join(args.models)}"] * (args.models != list(SIZES))
        + [f"--compilers {' '.join(args.compilers)}"] * (args.compilers != ["eager", "inductor"])
        + [f"--tag {args.tag}"] * bool(args.tag))
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    stem.with_suffix(".md").write_text(to_markdown(rows, command.strip()))
    print(to_markdown(rows, command.strip()))


if __name__ == "__main__":
    main()
