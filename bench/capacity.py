"""A Llama-2-7B-shaped model planned on the meta device, on this machine's CPU: nothing allocated.

    python -m bench.capacity                                # 32 layers, d 4096, 32 heads, SwiGLU 11008, seq 4096, bf16
    python -m bench.capacity --layers 4 --out bench/results # a smaller depth, same widths
    python -m bench.capacity --shape 70b                    # 80 layers, d 8192, 64 heads, 8 key/value heads

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
from torch import nn
from torch.nn import functional as F

from remat.models import Llama, LlamaConfig, apply_rotary
from remat.options import Options
from remat.passes.decide.graph_plan import plan_at
from remat.report import report_of
from remat.solvers.errors import BudgetError, format_bytes

LLAMA_7B = {"layers": 32, "d_model": 4096, "heads": 32, "hidden": 11008, "seq": 4096, "vocab": 32000, "batch": 1}
# Llama-2-70B: grouped-query attention, 8 key/value heads for 64 query heads
LLAMA_70B = {"layers": 80, "d_model": 8192, "heads": 64, "kv_heads": 8, "hidden": 28672, "seq": 4096,
             "vocab": 32000, "batch": 1}
SHAPES = {"7b": LLAMA_7B, "70b": LLAMA_70B}


class GroupedQueryAttention(nn.Module):
    """Causal rotary attention with ``kv_heads`` key/value heads shared by groups of query heads."""

    def __init__(self, d_model: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d_model // heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wkv = nn.Linear(d_model, 2 * kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.wkv(x).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


def meta_llama(**shape: Any) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A Llama-style model and its token inputs on the meta device, in bf16 (``kv_heads``: with
    grouped-query attention)."""
    kv_heads = shape.pop("kv_heads", None)
    cfg = LlamaConfig(**shape)
    with torch.device("meta"):
        model = Llama(cfg)
        if kv_heads is not None:
            for block in model.blocks:
                block.attn = GroupedQueryAttention(cfg.d_model, cfg.heads, kv_heads)
        model = model.to(torch.bfloat16)
        tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq)), torch.randint(cfg.vocab, (cfg.batch, cfg.seq))
    return model, tokens


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(layers: int, device: str, budget_gb: float, time_limit_s: float, shape: str = "7b") -> dict[str, Any]:
    model, inputs = meta_llama(**{**SHAPES[shape], "layers": layers})
    options = Options(compiler="inductor", time_limit_s=time_limit_s)
    t0 = time.perf_counter()
    backend = captured(model, inputs, options, device=device)
    base = report_of(backend.plans[0])
    planned_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    min_feasible = base.min_feasible_bytes
    min_feasible_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    at = plan_at(backend.plans[0], remat.budget_bytes(budget_gb))
    at_budget = None if isinstance(at, BudgetError) else report_of(at)
    budget_s = time.perf_counter() - t0
    blocks = (base.peer_rules or {}).get("checkpoint-blocks") or {}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"shape": shape, "layers": layers, "device": base.device, "weights": weights, "steps": base.joint_graph_steps, "candidates": base.candidates,
            "timings": {**base.timings, "smallest-peak solve": min_feasible_s, "solve at budget": budget_s},
            "planned_seconds": planned_s, "peak_rss_bytes": peak_rss_bytes(), "budget_gb": budget_gb,
            "store_all": base.store_all_peak_bytes, "checkpoint_blocks": blocks.get("peak_bytes"),
            "min_feasible": min_feasible, "min_feasible_exact": base.min_feasible_exact,
            "at_budget": None if at_budget is None else at_budget.predicted_peak_bytes,
            "at_budget_added": None if at_budget is None else at_budget.predicted_overhead_seconds,
            "status": None if at_budget is None else at_budget.solver_status,
            "gap": None if at_budget is None else at_budget.mip_gap, "notes": base.notes}


def describe(shape: str, layers: int) -> str:
    """The model's shape in words.

    >>> describe("70b", 80)
    '80 layers, d 8192, 64 heads (8 key/value heads), SwiGLU 28672, seq 4096, batch 1, bf16'
    """
    dims = SHAPES[shape]
    kv = f" ({dims['kv_heads']} key/value heads)" if "kv_heads" in dims else ""
    return (f"{layers} layers, d {dims['d_model']}, {dims['heads']} heads{kv}, SwiGLU {dims['hidden']}, "
            f"seq {dims['seq']}, batch {dims['batch']}, bf16")


def markdown(row: dict[str, Any], command: str) -> str:
    size = lambda b: "-" if b is None else format_bytes(b)  # noqa: E731
    gap = "-" if row["gap"] is None else f"{row['gap']:.2%}"
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in row["timings"].items())
    return "\n".join([
        f"# Llama-2-{row['shape'].upper()}-shaped model planned on the meta device ({dt.date.today().isoformat()})", "",
        f"Command: `{command}`", "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; planned for {row['device']}, nothing allocated or run.", "",
        f"Shape: {describe(row['shape'], row['layers'])}.", "",
        "| figure | value |", "|---|---:|",
        f"| joint-graph steps | {row['steps']} |", f"| keep/recompute candidates | {row['candidates']} |",
        f"| capture, profile and first solve | {row['planned_seconds']:.1f} s |",
        f"| planner's peak RSS | {format_bytes(row['peak_rss_bytes'])} |",
        f"| parameters and their gradients (held at every peak) | {size(2 * row['weights'])} |",
        f"| store-all peak | {size(row['store_all'])} |",
        f"| checkpoint per block peak | {size(row['checkpoint_blocks'])} |",
        f"| remat smallest feasible peak | {size(row['min_feasible'])} (exact: {row['min_feasible_exact']}) |",
        *([f"| remat at {row['budget_gb']:g} GiB | {size(row['at_budget'])} |",
           f"| ILP status, gap at {row['budget_gb']:g} GiB | {row['status']}, {gap} |"] if row["at_budget"] is not None
          else [f"| remat at {row['budget_gb']:g} GiB | refused: below the smallest feasible peak |"]), "",
        f"Timings: {timings}.", "",
        *(f"- {note}" for note in row["notes"]), ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    parser.add_argument("--layers", type=int, help="fewer layers of the same widths (default: the shape's)")
    parser.add_argument("--device", default="h100-80gb")
    parser.add_argument("--budget-gb", type=float, default=80.0)
    parser.add_argument("--time-limit-s", type=float, default=30.0)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    layers = args.layers or SHAPES[args.shape]["layers"]
    row = run(layers, args.device, args.budget_gb, args.time_limit_s, args.shape)
    suffix = "" if layers == SHAPES[args.shape]["layers"] else f"-{layers}l"
    path = pathlib.Path(args.out) / f"{dt.date.today().isoformat()}-capacity-{args.shape}{suffix}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    text = markdown(row, f"python -m bench.capacity {given}".strip())
    path.write_text(text)
    print(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
