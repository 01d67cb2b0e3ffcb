"""The demo: plan and compile a GPT-style model under a budget that forces recomputation.

    python -m remat.demo            # GPU if present, else CPU
    python -m remat.demo --device cpu --layers 4
"""

from __future__ import annotations

import argparse
import time

import torch

import remat
from remat.errors import GIB, format_bytes
from remat.measure import budget_peak
from remat.zoo import build

CPU_SIZE = {"layers": 4, "d_model": 128, "heads": 4, "seq": 128, "vocab": 1024, "batch": 8}
CUDA_SIZE = {"layers": 12, "d_model": 1024, "heads": 16, "seq": 2048, "vocab": 32000, "batch": 8}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m remat.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, help="override the model's depth")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="budget between the smallest feasible (0) and store-all (1) peak")
    parser.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    return parser.parse_args(argv)


def build_model(device: str, layers: int | None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    size = dict(CUDA_SIZE if device.startswith("cuda") else CPU_SIZE)
    if layers:
        size["layers"] = layers
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return build("gpt", device=device, dtype=dtype, **size)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, inputs = build_model(args.device, args.layers)
    print(f"GPT-style model on {args.device}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
    unconstrained = remat.plan(model, *inputs, compiler=args.compiler)
    low, high = unconstrained.min_feasible_bytes, unconstrained.unbinding_budget_bytes
    budget_gb = unconstrained.budget_at(args.fraction) / GIB
    print(f"budget to keep everything {format_bytes(high)}, smallest feasible {format_bytes(low)}: "
          f"planning under {budget_gb:.4f} GiB")
    compiled = remat.compile(model, budget_gb=budget_gb, compiler=args.compiler)
    t0 = time.perf_counter()
    compiled(*inputs).backward()  # first step: capture, profile, solve, compile
    print(f"first step (capture, plan, compile) {time.perf_counter() - t0:.1f} s")
    model.zero_grad(set_to_none=True)
    peak = budget_peak(lambda: compiled(*inputs).backward(), model, inputs, args.device)
    report = remat.reports(compiled)[0].with_measured_peak(peak)
    print(report.summary())


if __name__ == "__main__":
    main()
