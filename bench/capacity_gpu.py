"""The meta plan of a Llama-2-7B-shaped model at a few layers, checked on the GPU it names.

    python -m bench.capacity_gpu                        # 2 layers, seq 2048, on this machine's GPU
    python -m bench.capacity_gpu --layers 1 --seq 1024 --out bench/results

Plans the model on the meta device for this GPU (by name: h100-80gb, h200, a100-40gb, a100-80gb,
l4), then builds the same model on the GPU (bf16, random weights) and checks what meta planning
promised, each a failure when it does not hold:

- the joint graph is the one the GPU's capture gives: the same node count, the same backward
  nodes, the same attention kernel (flash or efficient: the meta rule for the named device), and
  the same store-all and smallest feasible peaks within 1 % (both FX-level, costs analytic);
- a budget the meta plan chose (a quarter of the way from its smallest feasible peak to store-all)
  is kept on the GPU: two steps compiled by remat under Inductor, each measured as the budget counts
  it (allocator peak during the step above the start, plus parameters, buffers and inputs), and
  cross-checked with ``torch.cuda.max_memory_allocated``.

Writes <date>-capacity-gpu-<gpu>.md to ``--out``; exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import shlex
import sys
from typing import Any

import torch

import remat
from bench.capacity import LLAMA_7B, meta_llama
from remat.errors import GIB
from remat.measure import budget_peak, held_bytes
from remat.models import Llama, LlamaConfig
from remat.solvers.errors import format_bytes

FRACTION = 0.25  # of the way from the smallest feasible peak to store-all
ATTENTION = ("flash_attention", "efficient_attention", "cudnn_attention", "math")


def named_device() -> str:
    """This GPU as a name ``remat.plan(device=...)`` knows."""
    name = torch.cuda.get_device_name().upper()
    memory = torch.cuda.get_device_properties(0).total_memory
    for marker, known in (("H200", "h200"), ("H100", "h100-80gb"), ("L4", "l4")):
        if marker in name:
            return known
    if "A100" in name:
        return "a100-80gb" if memory > 50 * GIB else "a100-40gb"
    raise SystemExit(f"no named device for {torch.cuda.get_device_name()!r}: add it to remat.passes.devices.NAMED")


def attention_ops(report: remat.Report) -> set[str]:
    return {row.op for row in report.nodes if any(kind in row.op for kind in ATTENTION)}


def gpu_llama(shape: dict[str, Any]) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    cfg = LlamaConfig(**shape)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Llama(cfg).to(torch.bfloat16)
        tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq)), torch.randint(cfg.vocab, (cfg.batch, cfg.seq))
    return model, tokens


def compare(meta: remat.Report, gpu: remat.Report) -> list[tuple[str, str, str, bool]]:
    """(figure, on meta, on the GPU, agrees) for the FX-level figures meta planning promises."""
    backward = lambda r: sum(row.decision == "backward" for row in r.nodes)  # noqa: E731
    close = lambda a, b: abs(a - b) <= 0.01 * max(a, b)  # noqa: E731
    return [
        ("joint-graph nodes", str(len(meta.nodes)), str(len(gpu.nodes)), len(meta.nodes) == len(gpu.nodes)),
        ("backward nodes", str(backward(meta)), str(backward(gpu)), backward(meta) == backward(gpu)),
        ("attention kernel", ", ".join(sorted(attention_ops(meta))), ", ".join(sorted(attention_ops(gpu))),
         attention_ops(meta) == attention_ops(gpu)),
        ("store-all peak", format_bytes(meta.store_all_peak_bytes), format_bytes(gpu.store_all_peak_bytes),
         close(meta.store_all_peak_bytes, gpu.store_all_peak_bytes)),
        ("smallest feasible peak", format_bytes(meta.min_feasible_bytes), format_bytes(gpu.min_feasible_bytes),
         close(meta.min_feasible_bytes, gpu.min_feasible_bytes)),
    ]


def train_under(model: torch.nn.Module, inputs: tuple, budget_bytes: int) -> dict[str, Any]:
    """Two steps compiled by remat (Inductor) under the budget, each measured as the budget counts it."""
    compiled = remat.compile(model, budget_gb=budget_bytes / GIB, plan_cache=False)
    steps = []
    try:  # step 1 compiles (a budget the compiled program cannot keep is refused there); it counts too
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()  # this script's own reading, beside remat's
            measured = budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cuda")
            allocator = torch.cuda.max_memory_allocated() - before + held_bytes(model, inputs)
            steps.append((measured, allocator))
    except remat.BudgetError as refused:
        return {"steps": [], "predicted": None, "compiled": None, "refused": str(refused)}
    report = remat.reports(compiled)[0]
    return {"steps": steps, "predicted": report.predicted_peak_bytes, "compiled": report.compiled_peak_bytes,
            "refused": None}


def markdown(device: str, shape: dict[str, Any], rows: list, budget: int, trained: dict[str, Any], command: str) -> str:
    ok = lambda b: "yes" if b else "**NO**"  # noqa: E731
    lines = [f"# A Llama-2-7B-shaped model's meta plan checked on {torch.cuda.get_device_name()} ({dt.date.today()})", "",
             f"Command: `{command}`", "", f"torch {torch.__version__}; planned on meta for `{device}`. Shape: "
             f"{shape['layers']} layers, d {shape['d_model']}, {shape['heads']} heads, SwiGLU {shape['hidden']}, "
             f"seq {shape['seq']}, batch {shape['batch']}, bf16.", "",
             "| figure (FX-level, analytic costs) | meta | GPU capture | agrees |", "|---|---:|---:|:-:|"]
    lines += [f"| {name} | {a} | {b} | {ok(same)} |" for name, a, b, same in rows]
    if trained["refused"]:
        return "\n".join(lines + ["", f"**Refused on the GPU** at {format_bytes(budget)}: {trained['refused']}"]) + "\n"
    lines += ["", f"Budget from the meta plan ({FRACTION:.0%} of the way from its smallest feasible peak to store-all): "
              f"{format_bytes(budget)}. remat's plan on the GPU predicts {format_bytes(trained['predicted'])} "
              f"(FX-level), its compiled program {format_bytes(trained['compiled'] or 0)}.", "",
              "| step | measured (remat's profiler) | `max_memory_allocated` | within budget |", "|---:|---:|---:|:-:|"]
    lines += [f"| {i + 1} | {format_bytes(m)} | {format_bytes(a)} | {ok(max(m, a) <= budget)} |"
              for i, (m, a) in enumerate(trained["steps"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.capacity_gpu checks a meta plan on a GPU: no CUDA device here")
    device = named_device()
    shape = {**LLAMA_7B, "layers": args.layers, "seq": args.seq}
    meta_model, meta_inputs = meta_llama(**shape)
    meta = remat.plan(meta_model, *meta_inputs, device=device, compiler="eager", plan_cache=False)
    model, inputs = gpu_llama(shape)
    gpu = remat.plan(model, *inputs, compiler="eager", profile="analytic", plan_cache=False)
    rows = compare(meta, gpu)
    budget = int(meta.min_feasible_bytes + FRACTION * (meta.store_all_peak_bytes - meta.min_feasible_bytes))
    trained = train_under(model, inputs, budget)
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    text = markdown(device, shape, rows, budget, trained, f"python -m bench.capacity_gpu {given}".strip())
    path = pathlib.Path(args.out) / f"{dt.date.today()}-capacity-gpu-{device}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)
    print(f"wrote {path}")
    held = all(same for *_, same in rows) and bool(trained["steps"]) and all(max(s) <= budget for s in trained["steps"])
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
