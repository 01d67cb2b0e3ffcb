"""The ``remat`` command: ``plan``, ``sweep`` and ``demo``.

    remat plan gpt --layers 12 --budget-gb 0.5
    remat plan llama --set d_model=256 --compiler eager --json
    remat plan --module mypkg.models:make --budget-gb 4     # make() returns (model, inputs)
    remat sweep gpt --points 6 --out sweep/                 # sweep.json, sweep.md, sweep.png
    remat demo --device cpu

Errors are one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

MODULE_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
BUILT_IN = "gpt, gpt-softmax, llama, convnet, vit or mlp-dropout"
MAX_MESSAGE = 600  # characters of an error message shown on its one line


class UsageError(ValueError):
    """A command line that cannot run as written."""


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def parse_overrides(pairs: list[str]) -> dict[str, int | float | str]:
    """``["layers=4", "dropout=0.1"]`` -> ``{"layers": 4, "dropout": 0.1}``."""
    out: dict[str, int | float | str] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set takes name=value, got {pair!r}")
        for kind in (int, float):
            try:
                out[key] = kind(raw)
                break
            except ValueError:
                continue
        else:
            out[key] = raw
    return out


def budget_list(text: str) -> list[float]:
    """``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]`` (GiB)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GiB numbers separated by commas, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one budget")
    return values


def load_factory(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``pkg.mod:factory`` -> what ``factory()`` returns, checked to be ``(model, inputs)``."""
    if not MODULE_SPEC.match(spec):
        raise UsageError(f"--module takes pkg.module:factory, got {spec!r}")
    module_name, factory_name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:
        raise UsageError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UsageError(f"module {module_name!r} has no callable {factory_name!r}")
    try:
        made = factory()
    except Exception as exc:
        raise UsageError(f"{spec}() raised {type(exc).__name__}: {exc}") from None
    return check_made(spec, made)


def check_made(spec: str, made: Any) -> tuple[Any, tuple[Any, ...]]:
    import torch

    if not (isinstance(made, (tuple, list)) and len(made) == 2 and callable(made[0])):
        raise UsageError(f"{spec}() must return (model, inputs), not {type(made).__name__}")
    model, inputs = made
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else inputs
    if not isinstance(inputs, (tuple, list)):
        raise UsageError(f"{spec}() must return (model, inputs) with inputs a tuple, not {type(inputs).__name__}")
    return model, tuple(inputs)


def load_model(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    if args.module and args.model:
        raise UsageError(f"give a built-in model ({args.model!r}) or --module, not both")
    if args.module:
        if args.set or args.layers:
            raise UsageError("--layers and --set apply to built-in models; configure your factory instead")
        return load_factory(args.module)
    if not args.model:
        raise UsageError(f"name a built-in model ({BUILT_IN}) or pass --module pkg.module:factory")
    from .zoo import build

    overrides = parse_overrides(args.set)
    if args.layers:
        overrides["layers"] = args.layers
    return build(args.model, device=args.device, **overrides)


def cmd_plan(args: argparse.Namespace) -> None:
    import remat

    model, inputs = load_model(args)
    report = remat.plan(model, *inputs, **option_values(args))
    print(report.to_json(indent=2) if args.json else report.summary())
    if args.timings and not args.json:
        print(timings_table(report.timings))


def timings_table(timings: dict[str, float]) -> str:
    """Compile seconds by phase, and the total.

    >>> print(timings_table({"capture": 1.5, "inductor": 10.0}))
    phase       seconds
    capture        1.50
    inductor      10.00
    total         11.50
    """
    rows = [*timings.items(), ("total", sum(timings.values()))]
    return "\n".join([f"{'phase':<10}{'seconds':>9}", *(f"{phase:<10}{seconds:>9.2f}" for phase, seconds in rows)])


def cmd_sweep(args: argparse.Namespace) -> None:
    import remat

    model, inputs = load_model(args)
    frontier = remat.sweep(model, *inputs, budgets=args.budgets_gb, points=args.points, measure=args.measure,
                           **option_values(args))
    print(frontier.to_markdown())
    if args.out is None:
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(frontier.to_json(indent=2) + "\n")
    (out / "sweep.md").write_text(frontier.to_markdown())
    written = ["sweep.json", "sweep.md"]
    try:
        frontier.plot().savefig(out / "sweep.png", dpi=120)
        written.append("sweep.png")
    except ImportError as exc:
        print(f"remat: no sweep.png: {exc}", file=sys.stderr)
    print(f"wrote {', '.join(str(out / name) for name in written)}")


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import main as demo

    argv = ["--device", args.device] if args.device else []
    argv += ["--layers", str(args.layers)] if args.layers else []
    demo(argv + ["--compiler", args.compiler])


def model_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("model", nargs="?", help=f"a built-in model (remat.zoo): {BUILT_IN}")
    command.add_argument("--module", metavar="PKG.MOD:FACTORY",
                         help="your own model: FACTORY() returns (model, inputs); found from the current folder")
    command.add_argument("--layers", type=int, help="depth of a built-in model")
    command.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                         help="any config field of a built-in model")
    command.add_argument("--device", default="cpu", help="device of a built-in model (default: cpu)")


# The options are remat.Options' fields (one definition); here only how each is typed on a command line.
OPTION_FLAGS: dict[str, dict[str, Any]] = {
    "budget_gb": {"type": float, "metavar": "GIB", "help": "omit for no limit"},
    "solver": {"metavar": "NAME", "help": "a solver name (remat.solvers.names()); default ilp"},
    "time_limit_s": {"type": float, "metavar": "S", "help": "per solve; default 30"},
    "profile": {"choices": ["measure", "analytic"]},
    "compiler": {"choices": ["inductor", "eager"]},
    "headroom": {"type": float, "metavar": "FRACTION", "help": "of the budget, held back; default none"},
    "plan_cache": {"type": lambda text: {"on": True, "off": False}.get(text, text), "metavar": "on|off|DIR",
                   "help": "default on"},
    "policy": {"metavar": "NAME", "help": "pin decisions by a built-in policy (remat.policies), e.g. save-matmuls"},
    "checkpoint_regions": {"choices": ["recompute", "plan"],
                           "help": "regions wrapped in torch.utils.checkpoint: recompute as asked (default), "
                                   "or let remat plan them"},
    "budget_scope": {"choices": ["auto", "step", "rank", "graph"],
                     "help": "the budget bounds the training step as it runs, per rank under FSDP2 or DDP "
                             "(auto, the default; step and rank say the same), or each graph's own step (graph)"},
}


def option_arguments(command: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """A flag for each of remat.Options' fields, defaulting to the field's default."""
    from .options import Options

    defaults = Options().kwargs()
    for name in Options.names():
        if name not in skip:
            command.add_argument("--" + name.replace("_", "-"), dest=f"option_{name}", default=defaults[name],
                                 **OPTION_FLAGS[name])


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line (each flag's value or its default), by name."""
    prefix = "option_"
    return {key[len(prefix):]: value for key, value in vars(args).items() if key.startswith(prefix)}


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="remat", description="Fit a training step in a memory budget.")
    top.add_argument("-v", "--verbose", action="count", default=0, help="log what remat does (-vv: debug)")
    top.add_argument("--traceback", action="store_true", help="show the traceback of an error")
    sub = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    plan = sub.add_parser("plan", help="plan a model under a budget and print the report")
    model_arguments(plan)
    option_arguments(plan)
    plan.add_argument("--json", action="store_true", help="the whole report as JSON")
    plan.add_argument("--timings", action="store_true",
                      help="where the compile time went: capture, profile, solve, inductor (per graph)")
    plan.set_defaults(run=cmd_plan)
    sweep = sub.add_parser("sweep", help="plan a model at several budgets; print and write the frontier")
    model_arguments(sweep)
    option_arguments(sweep, skip=("budget_gb", "plan_cache"))
    sweep.add_argument("--points", type=int, default=6,
                       help="budgets from the smallest feasible to store-all (default: 6)")
    sweep.add_argument("--budgets-gb", type=budget_list, metavar="GB,GB,...", help="these budgets instead")
    sweep.add_argument("--measure", action="store_true", help="also compile and run a step at each budget")
    sweep.add_argument("--out", metavar="DIR", help="write sweep.json, sweep.md and sweep.png here")
    sweep.set_defaults(run=cmd_sweep)
    demo = sub.add_parser("demo", help="plan and compile a GPT-style model under a budget")
    demo.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    demo.add_argument("--layers", type=int, help="override the model's depth")
    demo.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    demo.set_defaults(run=cmd_demo)
    return top


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " ..."


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    level = logging.WARNING if not args.verbose else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(name)s: %(message)s")
    logging.getLogger("remat").setLevel(level)
    from .errors import BudgetError, PlanError, SolverUnavailable

    if os.getcwd() not in sys.path:  # models come from where the command runs, as with python -m
        sys.path.insert(0, os.getcwd())
    try:
        args.run(args)
    except (BudgetError, PlanError, SolverUnavailable, ValueError, TypeError, ImportError, OSError) as exc:
        if args.traceback:
            raise
        print(f"remat: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.traceback:
            raise
        print(f"remat: {type(exc).__name__}: {one_line(exc)} (rerun with --traceback for where)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
