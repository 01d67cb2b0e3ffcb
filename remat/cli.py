"""The ``remat`` command: ``remat demo`` and ``remat plan``.

    remat demo --device cpu
    remat plan gpt --layers 12 --budget-gb 0.5
    remat plan llama --set d_model=256 --compiler eager --json
"""

from __future__ import annotations

import argparse
import sys

from .errors import BudgetError, PlanError


def parse_overrides(pairs: list[str]) -> dict[str, int | float | str]:
    """``["layers=4", "dropout=0.1"]`` -> ``{"layers": 4, "dropout": 0.1}``."""
    out: dict[str, int | float | str] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes name=value, got {pair!r}")
        for kind in (int, float):
            try:
                out[key] = kind(raw)
                break
            except ValueError:
                continue
        else:
            out[key] = raw
    return out


def cmd_plan(args: argparse.Namespace) -> None:
    import remat

    try:
        from bench.models import build
    except ModuleNotFoundError:
        raise ValueError("the built-in models live in the repository's bench/ folder: run from its root") from None
    overrides = parse_overrides(args.set)
    if args.layers:
        overrides["layers"] = args.layers
    model, inputs = build(args.model, device=args.device, **overrides)
    report = remat.plan(model, *inputs, budget_gb=args.budget_gb, compiler=args.compiler,
                        solver=args.solver, time_limit_s=args.time_limit_s)
    print(report.to_json(indent=2) if args.json else report.summary())


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import main as demo

    demo(["--device", args.device] if args.device else [])


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="remat", description="Fit a training step in a memory budget.")
    sub = top.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan a built-in model (bench/models.py) and print the report")
    plan.add_argument("model", help="gpt, gpt-softmax, llama, convnet, vit or mlp-dropout")
    plan.add_argument("--budget-gb", type=float, default=None, help="GiB; omit for no limit")
    plan.add_argument("--layers", type=int, help="model depth")
    plan.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="any config field")
    plan.add_argument("--device", default="cpu")
    plan.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    plan.add_argument("--solver", default="ilp")
    plan.add_argument("--time-limit-s", type=float, default=30.0)
    plan.add_argument("--json", action="store_true", help="the whole report as JSON")
    plan.set_defaults(run=cmd_plan)
    demo = sub.add_parser("demo", help="plan and compile a GPT-style model under a budget")
    demo.add_argument("--device", default=None)
    demo.set_defaults(run=cmd_demo)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except (BudgetError, PlanError, ValueError, TypeError) as exc:
        print(f"remat: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
