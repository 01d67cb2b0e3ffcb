"""A Llama-2-7B-shaped model planned on the meta device, on this machine's CPU: nothing allocated.

    python -m bench.capacity                                # 32 layers, d 4096, 32 heads, SwiGLU 11008, seq 4096, bf16
    python -m bench.capacity --layers 4 --out bench/results # a smaller depth, same widths

Plans the model for an H100 (80 GiB) with no budget (the fastest plan), then at ``--budget-gb``
(default 80): records planning time by phase, the planner's own peak resident memory, the joint
graph's size, the ILP's status and gap, and the predicted peaks of store-all, checkpoint per block
and remat (the smallest feasible, and the plan at the budget). Every figure is the FX-level model
(see docs/capacity.md). Writes <date>-capacity-7b.md (with --layers, -capacity-7b-<N>l.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import platform
import resource
import shlex
import sys
import time
from typing import Any

import torch

import remat
from remat.api import captured
from remat.models import Llama, LlamaConfig
from remat.options import Options
from remat.passes.partition import plan_at
from remat.report import report_of
from remat.solvers.errors import BudgetError, format_bytes

LLAMA_7B = {"layers": 32, "d_model": 4096, "heads": 32, "hidden": 11008, "seq": 4096, "vocab": 32000, "batch": 1}


def meta_llama(**shape: Any) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A Llama-style model and its token inputs on the meta device, in bf16."""
    cfg = LlamaConfig(**shape)
    with torch.device("meta"):
        model = Llama(cfg).to(torch.bfloat16)
        tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq)), torch.randint(cfg.vocab, (cfg.batch, cfg.seq))
    return model, tokens


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(layers: int, device: str, budget_gb: float, time_limit_s: float) -> dict[str, Any]:
    model, inputs = meta_llama(**{**LLAMA_7B, "layers": layers})
    options = Options(compiler="inductor", time_limit_s=time_limit_s)
    t0 = time.perf_counter()
    backend = captured(model, inputs, options, device=device)
    base = report_of(backend.planner.plans[0])
    planned_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    min_feasible = base.min_feasible_bytes
    min_feasible_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    at = plan_at(backend.planner.plans[0], remat.budget_bytes(budget_gb))
    at_budget = None if isinstance(at, BudgetError) else report_of(at)
    budget_s = time.perf_counter() - t0
    blocks = (base.peer_rules or {}).get("checkpoint-blocks") or {}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"layers": layers, "device": base.device, "weights": weights, "steps": base.joint_graph_steps, "candidates": base.candidates,
            "timings": {**base.timings, "smallest-peak solve": min_feasible_s, "solve at budget": budget_s},
            "planned_seconds": planned_s, "peak_rss_bytes": peak_rss_bytes(), "budget_gb": budget_gb,
            "store_all": base.store_all_peak_bytes, "checkpoint_blocks": blocks.get("peak_bytes"),
            "min_feasible": min_feasible, "min_feasible_exact": base.min_feasible_exact,
            "at_budget": None if at_budget is None else at_budget.predicted_peak_bytes,
            "at_budget_added": None if at_budget is None else at_budget.predicted_overhead_seconds,
            "status": None if at_budget is None else at_budget.solver_status,
            "gap": None if at_budget is None else at_budget.mip_gap, "notes": base.notes}


def markdown(row: dict[str, Any], command: str) -> str:
    size = lambda b: "-" if b is None else format_bytes(b)  # noqa: E731
    gap = "-" if row["gap"] is None else f"{row['gap']:.2%}"
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in row["timings"].items())
    return "\n".join([
        f"# Llama-2-7B-shaped model planned on the meta device ({dt.date.today().isoformat()})", "",
        f"Command: `{command}`", "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; planned for {row['device']}, nothing allocated or run.", "",
        f"Shape: {row['layers']} layers, d 4096, 32 heads, SwiGLU 11008, seq 4096, batch 1, bf16.", "",
        "| figure | value |", "|---|---:|",
        f"| joint-graph steps | {row['steps']} |", f"| keep/recompute candidates | {row['candidates']} |",
        f"| capture, profile and first solve | {row['planned_seconds']:.1f} s |",
        f"| planner's peak RSS | {format_bytes(row['peak_rss_bytes'])} |",
        f"| parameters and their gradients (held at every peak) | {size(2 * row['weights'])} |",
        f"| store-all peak | {size(row['store_all'])} |",
        f"| checkpoint per block peak | {size(row['checkpoint_blocks'])} |",
        f"| remat smallest feasible peak | {size(row['min_feasible'])} (exact: {row['min_feasible_exact']}) |",
        f"| remat at {row['budget_gb']:g} GiB | {size(row['at_budget'])} |",
        f"| ILP status, gap at {row['budget_gb']:g} GiB | {row['status']}, {gap} |", "",
        f"Timings: {timings}.", "",
        *(f"- {note}" for note in row["notes"]), ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=LLAMA_7B["layers"])
    parser.add_argument("--device", default="h100-80gb")
    parser.add_argument("--budget-gb", type=float, default=80.0)
    parser.add_argument("--time-limit-s", type=float, default=30.0)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    row = run(args.layers, args.device, args.budget_gb, args.time_limit_s)
    suffix = "" if args.layers == LLAMA_7B["layers"] else f"-{args.layers}l"
    path = pathlib.Path(args.out) / f"{dt.date.today().isoformat()}-capacity-7b{suffix}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    text = markdown(row, f"python -m bench.capacity {given}".strip())
    path.write_text(text)
    print(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
