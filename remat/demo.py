"""The demo: plan and compile a GPT-style model under a budget that forces recomputation.

    python -m remat.demo            # GPU if present, else CPU
    python -m remat.demo --device cpu --layers 4
    remat demo --fraction 0.3       # the same flags (arguments() declares them for both)
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from remat.cli import output_arguments, show
from remat.options import add_flags, given

if TYPE_CHECKING:
    import torch

CPU_SIZE = {"layers": 4, "d_model": 128, "heads": 4, "seq": 128, "vocab": 1024, "batch": 8}
CUDA_SIZE = {"layers": 12, "d_model": 1024, "heads": 16, "seq": 2048, "vocab": 32000, "batch": 8}


def fraction(text: str) -> float:
    """A ``--fraction``: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


def arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags, for ``python -m remat.demo`` and ``remat demo`` alike: its own, then
    the options of ``remat.plan`` and ``remat.compile`` but the budget, which ``--fraction`` places."""
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    parser.add_argument("--layers", type=int, metavar="N", help="override the model's depth")
    parser.add_argument("--fraction", type=fraction, default=0.5, metavar="FRACTION",
                        help="budget between the smallest feasible (0) and store-all (1) peak (default: 0.5)")
    output_arguments(parser)
    add_flags(parser, skip=("budget_gb",))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m remat.demo", description=__doc__.splitlines()[0])
    arguments(parser)
    return parser.parse_args(argv)


def build_model(device: str, layers: int | None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import torch

    from remat.zoo import build

    size = dict(CUDA_SIZE if device.startswith("cuda") else CPU_SIZE)
    if layers:
        size["layers"] = layers
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return build("gpt", device=device, dtype=dtype, **size)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


def run(args: argparse.Namespace) -> None:
    """The demo, with ``args`` as :func:`arguments` declares them."""
    import torch

    import remat
    from remat.errors import GIB, format_bytes
    from remat.measure import budget_peak

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    options = given(args)
    out = sys.stderr if args.json else sys.stdout  # under --json, stdout has the report alone
    model, inputs = build_model(device, args.layers)
    print(f"GPT-style model on {device}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters",
          file=out)
    unconstrained = remat.plan(model, *inputs, **options)
    low, high = unconstrained.min_feasible_bytes, unconstrained.unbinding_budget_bytes
    budget_gb = unconstrained.budget_at(args.fraction) / GIB
    print(f"budget to keep everything {format_bytes(high)}, smallest feasible {format_bytes(low)}: "
          f"planning under {budget_gb:.4f} GiB", file=out)
    compiled = remat.compile(model, budget_gb=budget_gb, **options)
    t0 = time.perf_counter()
    compiled(*inputs).backward()  # first step: capture, profile, solve, compile
    print(f"first step (capture, plan, compile) {time.perf_counter() - t0:.1f} s", file=out)
    model.zero_grad(set_to_none=True)
    peak = budget_peak(lambda: compiled(*inputs).backward(), model, inputs, device)
    show(remat.reports(compiled)[0].with_measured_peak(peak), args)


if __name__ == "__main__":
    main()
