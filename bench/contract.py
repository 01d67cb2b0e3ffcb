"""The budget contract measured on the CPU: measured peak against the budget and the compiled account.

    python -m bench.contract                       # every bench model under Inductor, five budgets
    python -m bench.contract --models gpt convnet --compilers inductor eager
    python -m bench.contract --buffer-reuse        # Inductor's buffer reuse on for remat's graphs
    python -m bench.contract --loss outside        # the loss computed outside the model, steps 1 and 2
    python -m bench.contract --loss outside --graph-break --models gpt llama

For each model and compiler, at budgets 0, 25, 50, 75 and 100 % of the way from
the smallest feasible budget (``remat.plan``'s, exact) to the one at which
keeping everything fits: the CPU profiler's peak during a compiled step plus
the graph's inputs, the budget, remat's FX-level prediction and, under
Inductor, the peak of the program Inductor generated (``compiled_peak_bytes``).
Per model: the smallest feasible budget against the lowest measured peak.
Results go to bench/results/<date>-cpu-contract.{json,md} (``-buffer-reuse`` added with that flag).

With ``--loss outside`` each model returns its predictions and the loss is computed outside it, as
most training loops are written (the budget is the step's, ``budget_scope`` "auto"). One unbudgeted
step first measures the eager code after the graph (what ``remat.plan`` and every compile after it then
count); at each budget the first step (compiling) and the second are measured apart. ``--graph-break``
adds a data-dependent branch after the first block (transformers only): several graphs share the step,
and the figures are the largest over the step's graphs.
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
from remat.zoo import LossOutside
from remat.zoo import build as build_zoo
from remat.zoo import build_loss_outside

HF = {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "vocab": 256, "batch": 4}
SIZES = {"gpt": {"batch": 8, "seq": 64}, "gpt-softmax": {"batch": 8, "seq": 64}, "llama": {"batch": 8, "seq": 64},
         "convnet": {"batch": 8}, "vit": {"batch": 8}, "mlp-dropout": {"batch": 64},
         "hf-gpt2": HF, "hf-llama": HF, "hf-bert": HF}
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
NOTE_INSIDE = "*checked* is the compiled program's peak under Inductor, the model's op by op."
NOTE_OUTSIDE = ("The loss is computed outside the model. *compiled*: the step's peak by the compiled programs' "
                "account with the eager code measured on the first step; *step 1* (it compiles) and *step 2*: "
                "measured as the budget counts them; *eager*: the eager window counted.")


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


def build_outside(name: str, graph_break: bool) -> LossOutside:
    broken = {"graph_break_after": 1} if graph_break else {}
    if name.startswith("hf-"):
        return hf_models.build_loss_outside(name, **SIZES[name])
    return build_loss_outside(name, **SIZES.get(name, {}), **broken)


def step_limits(run: LossOutside, compiler: str, warm: object) -> tuple[int, int]:
    """The step's smallest feasible budget and store-all peak. One graph: ``remat.plan``'s (exact, counting
    the eager code the warm step measured). Several: the largest over the warm compile's graphs (the
    smallest feasible is then the model's estimate; :func:`measure_outside` corrects it from the error)."""
    reports = remat.reports(warm)
    if len(reports) == 1:
        adapter.reset_compiled()
        top = remat.plan(run.model, *run.inputs, compiler=compiler, plan_cache=False)
        return top.min_feasible_bytes, top.store_all_peak_bytes
    return max(r.min_feasible_bytes for r in reports), max(r.store_all_peak_bytes for r in reports)


def steps_at(run: LossOutside, compiler: str, budget: int) -> tuple[object, list[int]]:
    adapter.reset_compiled()
    compiled = remat.compile(run.model, budget_gb=budget / GIB, compiler=compiler, plan_cache=False)
    measured = []
    for _ in range(2):
        run.model.zero_grad(set_to_none=True)
        measured.append(budget_peak(lambda: run.step(compiled), run.model, run.inputs, "cpu"))
    return compiled, measured


def measure_outside(name: str, compiler: str, graph_break: bool) -> list[dict]:
    """One row per budget fraction, the loss outside the model: steps 1 and 2 measured apart."""
    run = build_outside(name, graph_break)
    adapter.reset_compiled()
    warm = remat.compile(run.model, compiler=compiler, plan_cache=False)
    for _ in range(2):  # the first step measures the eager parts, the second counts them
        run.step(warm)
    low, store = step_limits(run, compiler, warm)
    rows = []
    for fraction in FRACTIONS:
        budget = int(low + fraction * (store - low))
        try:
            compiled, measured = steps_at(run, compiler, budget)
        except remat.BudgetError as exc:  # an estimate below what a graph's program fits: its own figure
            if fraction or exc.min_feasible_bytes is None:
                raise
            low = budget = exc.min_feasible_bytes
            compiled, measured = steps_at(run, compiler, budget)
        reports = remat.reports(compiled)
        compiled_peak = max((r.compiled_peak_bytes or 0) for r in reports) or None
        rows.append({"model": name, "compiler": compiler, "fraction": fraction, "budget_bytes": budget,
                     "graphs": len(reports), "predicted_peak_bytes": max(r.predicted_peak_bytes for r in reports),
                     "compiled_peak_bytes": compiled_peak, "step1_bytes": measured[0], "measured_peak_bytes": measured[1],
                     "eager_bytes": reports[0].eager_bytes, "within_budget": max(measured) <= budget,
                     "compile_attempts": sum(r.compile_attempts for r in reports), "min_feasible_bytes": low})
    lowest = min(min(r["step1_bytes"], r["measured_peak_bytes"]) for r in rows)
    for r in rows:
        r["min_feasible_over_lowest_measured"] = round(low / lowest, 4)
    return rows


def markdown_outside(rows: list[dict]) -> str:
    out = ("| model | graphs | fraction | budget B | compiled B | step 1 B | step 2 B | eager B | within budget "
           "| smallest feasible / lowest measured |\n|---|---|---|---|---|---|---|---|---|---|\n")
    return out + "".join(
        f"| {r['model']} | {r['graphs']} | {r['fraction']} | {r['budget_bytes']} | {r['compiled_peak_bytes'] or ''} "
        f"| {r['step1_bytes']} | {r['measured_peak_bytes']} | {r['eager_bytes']} | {r['within_budget']} "
        f"| {r['min_feasible_over_lowest_measured']} |\n" for r in rows)


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
    parser.add_argument("--loss", choices=["inside", "outside"], default="inside",
                        help="where the loss is computed: inside the model (default) or outside it, as most "
                             "training loops do")
    parser.add_argument("--graph-break", action="store_true", help="with --loss outside: a graph break after the "
                                                                   "first block (transformers)")
    args = parser.parse_args(argv)
    if args.graph_break and args.loss != "outside":
        parser.error("--graph-break goes with --loss outside")
    adapter.INDUCTOR_SETTINGS["allow_buffer_reuse"] = args.buffer_reuse
    outside = args.loss == "outside"
    table = markdown_outside if outside else markdown
    rows = []
    for name in args.models:
        for compiler in args.compilers:
            rows += measure_outside(name, compiler, args.graph_break) if outside else measure_model(name, compiler)
            print(table(rows[-len(FRACTIONS):]), flush=True)
    today = dt.date.today().isoformat()
    command = f"python -m bench.contract --models {' '.join(args.models)} --compilers {' '.join(args.compilers)}"
    command += " --buffer-reuse" if args.buffer_reuse else ""
    command += " --loss outside" if outside else ""
    command += " --graph-break" if args.graph_break else ""
    stem = (f"{today}-cpu-contract" + ("-buffer-reuse" if args.buffer_reuse else "")
            + ("-loss-outside" if outside else "") + ("-graph-break" if args.graph_break else ""))
    meta = {"date": today, "device": "cpu", "torch": torch.__version__, "sizes": SIZES, "command": command}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (out / f"{stem}.md").write_text(
        f"# Budget contract on the CPU, {today}, torch {torch.__version__}\n\nCommand: `{command}`\n\n"
        f"Bytes. {NOTE_OUTSIDE if outside else NOTE_INSIDE}\n\n{table(rows)}")
    print(table(rows))


if __name__ == "__main__":
    main()
