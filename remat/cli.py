"""The ``remat`` command: ``plan``, ``sweep``, ``fit`` and ``demo``.

    remat plan gpt --layers 12 --budget-gb 0.5
    remat plan llama --set d_model=256 --compiler eager --json
    remat plan --module mypkg.models:make --budget-gb 4     # make() returns (model, inputs)
    remat sweep gpt --points 6 --out sweep/                 # sweep.json, sweep.md, sweep.png
    remat fit llama --budget-gb 70 --vary seq --device h100-80gb   # planned on meta: nothing allocated
    remat demo --device cpu

Every subcommand takes remat's options as flags declared once, with the options
(``remat.options.Options``); ``--json`` prints data instead of text. Errors are one
line on stderr, in the command's terms (``--budget-gb``, not ``budget_gb=``), and
exit with status 2. torch is imported only by the subcommand that runs, so
``remat --help`` is quick.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .cli_output import sweep_timings, timings_table, write_fit, write_sweep
from .options import add_flags, flag_of, given

if TYPE_CHECKING:
    from .report import Report

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
    """``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]`` (GiB).

    >>> budget_list("0.5,1,2")
    [0.5, 1.0, 2.0]
    """
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
    report = remat.plan(model, *inputs, **given(args))
    report.to_dict()  # its deferred figures (the smallest feasible budget): the reader cannot ask later
    show(report, args)


PLAN_TIMINGS = "where the compile time went: capture, profile, solve, inductor"


def output_arguments(command: argparse.ArgumentParser, *, what: str = "report", timings: str = PLAN_TIMINGS) -> None:
    """``--json`` and ``--timings``, as every subcommand takes them (under ``--json`` the
    timings go to stderr, so that stdout is the JSON alone)."""
    command.add_argument("--json", action="store_true", help=f"the whole {what} as JSON")
    command.add_argument("--timings", action="store_true", help=timings)


def show(report: Report, args: argparse.Namespace) -> None:
    """``report`` as ``--json`` and ``--timings`` ask."""
    print(report.to_json(indent=2) if args.json else report.summary())
    if args.timings:
        print(timings_table(report.timings), file=sys.stderr if args.json else sys.stdout)


def cmd_sweep(args: argparse.Namespace) -> None:
    import remat

    model, inputs = load_model(args)
    t0 = time.perf_counter()
    frontier = remat.sweep(model, *inputs, budgets=args.budgets_gb, points=args.points, measure=args.measure,
                           **given(args))
    seconds = time.perf_counter() - t0
    print(frontier.to_json(indent=2) if args.json else frontier.to_markdown())
    notes = sys.stderr if args.json else sys.stdout  # under --json, stdout has the frontier alone
    if args.timings:
        print(timings_table(sweep_timings(frontier.rows, seconds)), file=notes)
    if args.out is not None:
        print(f"wrote {', '.join(write_sweep(frontier, Path(args.out)))}", file=notes)


SWEEP_TIMINGS = "seconds solving (every budget) and in the rest: capture, profile, --measure's steps"


def cmd_fit(args: argparse.Namespace) -> None:
    import json

    import remat
    from remat.passes.devices import device_spec

    at_size = sized_models(args)
    options = given(args)
    if options["budget_gb"] is None:  # the whole device
        options["budget_gb"] = device_spec(args.device).memory_bytes / 2 ** 30
    found = remat.fit(lambda size: at_size(size)[0], lambda size: at_size(size)[1], vary=args.vary, low=args.low,
                      high=args.high, device=args.device, **options)
    print(json.dumps(found.to_dict(), indent=2) if args.json else
          f"{found.to_markdown()}\n\nlargest {args.vary} that fits {options['budget_gb']:g} GiB on "
          f"{found.device}: {found.size} (sizes captured: {', '.join(map(str, found.captured))})")
    if args.out is not None:
        print(f"wrote {', '.join(write_fit(found, Path(args.out)))}", file=sys.stderr if args.json else sys.stdout)


def sized_models(args: argparse.Namespace) -> Any:
    """size -> (model, inputs) on the meta device: a built-in model with its batch or seq set to the
    size, or ``FACTORY(size)`` of ``--module`` (each built once)."""
    import functools

    import torch

    from .zoo import build

    if args.module and args.model:
        raise UsageError(f"give a built-in model ({args.model!r}) or --module, not both")
    if not args.module and not args.model:
        raise UsageError(f"name a built-in model ({BUILT_IN}) or pass --module pkg.module:factory")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    overrides = parse_overrides(args.set) | ({"layers": args.layers} if args.layers else {})

    @functools.cache
    def at_size(size: int) -> tuple[Any, tuple[Any, ...]]:
        if args.module:
            return check_made(args.module, load_callable(args.module)(size))
        with torch.device("meta"):  # parameters made on meta: a 7B model allocates nothing
            return build(args.model, device="meta", dtype=dtype, **{**overrides, args.vary: size})

    return at_size


def load_callable(spec: str) -> Any:
    """``pkg.mod:name`` -> that callable."""
    if not MODULE_SPEC.match(spec):
        raise UsageError(f"--module takes pkg.module:factory, got {spec!r}")
    module_name, name = spec.split(":")
    found = getattr(importlib.import_module(module_name), name, None)
    if not callable(found):
        raise UsageError(f"module {module_name!r} has no callable {name!r}")
    return found


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run

    run(args)


def model_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("model", nargs="?", help=f"a built-in model (remat.zoo): {BUILT_IN}")
    command.add_argument("--module", metavar="PKG.MOD:FACTORY",
                         help="your own model: FACTORY() returns (model, inputs); found from the current folder")
    command.add_argument("--layers", type=int, metavar="N", help="depth of a built-in model")
    command.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                         help="any config field of a built-in model")
    command.add_argument("--device", default="cpu", help="device of a built-in model (default: cpu)")


# What remat.sweep takes of the options: no single budget, no plan cache (it solves each budget once).
SWEEP_SKIPS = ("budget_gb", "plan_cache")


def parser() -> argparse.ArgumentParser:
    from . import demo

    top = Parser(prog="remat", description="Fit a training step in a memory budget.")
    top.add_argument("-v", "--verbose", action="count", default=0, help="log what remat does (-vv: debug)")
    top.add_argument("--traceback", action="store_true", help="show the traceback of an error")
    sub = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    plan = sub.add_parser("plan", help="plan a model under a budget and print the report")
    model_arguments(plan)
    output_arguments(plan)
    add_flags(plan)
    plan.set_defaults(run=cmd_plan)
    sweep = sub.add_parser("sweep", help="plan a model at several budgets; print and write the frontier")
    model_arguments(sweep)
    sweep.add_argument("--points", type=int, default=6, metavar="N",
                       help="budgets from the smallest feasible to store-all (default: 6)")
    sweep.add_argument("--budgets-gb", type=budget_list, metavar="GIB,GIB,...", help="these budgets instead")
    sweep.add_argument("--measure", action="store_true", help="also compile and run a step at each budget")
    sweep.add_argument("--out", metavar="DIR", help="write sweep.json, sweep.md and sweep.png here")
    output_arguments(sweep, what="frontier", timings=SWEEP_TIMINGS)
    add_flags(sweep, skip=SWEEP_SKIPS)
    sweep.set_defaults(run=cmd_sweep, renamed={"budget_gb": "--budgets-gb"})
    fit = sub.add_parser("fit", help="the largest batch or sequence length whose step fits, planned on meta")
    fit.add_argument("model", nargs="?", help=f"a built-in model (remat.zoo): {BUILT_IN}")
    fit.add_argument("--module", metavar="PKG.MOD:FACTORY",
                     help="your own model: FACTORY(size) returns (model, inputs) at that size, on the meta device")
    fit.add_argument("--layers", type=int, metavar="N", help="depth of a built-in model")
    fit.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="any config field of a built-in model")
    fit.add_argument("--device", default="cpu", help="the device planned for: h100-80gb, h200, a100-40gb, "
                     "a100-80gb, l4 or cpu (default: cpu); --budget-gb defaults to its memory")
    fit.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                     help="a built-in model's parameter dtype (default: float32)")
    fit.add_argument("--vary", default="batch", choices=("batch", "seq"), help="what grows (default: batch)")
    fit.add_argument("--low", type=int, default=1, metavar="N", help="the smallest size tried (default: 1)")
    fit.add_argument("--high", type=int, metavar="N", help="the largest size tried (default: until refused)")
    fit.add_argument("--out", metavar="DIR", help="write fit.json, fit.md and fit.png here")
    output_arguments(fit, what="fit")
    add_flags(fit)
    fit.set_defaults(run=cmd_fit)
    demo_command = sub.add_parser("demo", help="plan and compile a GPT-style model under a budget")
    demo.arguments(demo_command)
    demo_command.set_defaults(run=cmd_demo)
    return top


def in_cli_terms(message: str, flags: dict[str, str]) -> str:
    """An API error's ``message`` with each option named as the flag that sets it (``flags``:
    option name -> flag). The API's own message stays as it is for API users.

    >>> flags = {"budget_gb": "--budget-gb", "time_limit_s": "--time-limit-s", "headroom": "--headroom"}
    >>> in_cli_terms("Raise budget_gb to at least 0.0123, or shrink the batch.", flags)
    'Rerun with --budget-gb 0.0123 or more, or shrink the batch.'
    >>> in_cli_terms("a longer time_limit_s may help; or budget_gb=None; pass headroom= to plan", flags)
    'a longer --time-limit-s may help; or omit --budget-gb; pass --headroom to plan'
    >>> in_cli_terms("headroom must be a fraction in [0, 1), not 2.0 (for example budget_gb=20)", flags)
    '--headroom must be a fraction in [0, 1), not 2.0 (for example --budget-gb 20)'
    """
    for name, flag in flags.items():
        message = re.sub(rf"\b([Rr])aise {name} to at least (\S+?)([,.;]?(\s|$))",
                         rf"\1erun with {flag} \2 or more\3", message)
        message = re.sub(rf"\b{name}=None\b", f"omit {flag}", message)
        message = re.sub(rf"\b{name}=['\"]?([^\s,;)'\"]+)['\"]?", rf"{flag} \1", message)
        message = re.sub(rf"\b{name}=", flag, message)
        # a bare name: one with an underscore is no English word; any name as the subject of "must be"
        bare = rf"\b{name}\b" if "_" in name else rf"\b{name}(?= must be)"
        message = re.sub(rf"(?<![.\w'\"-]){bare}", flag, message)
    return message


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
        flags = {name: flag_of(name) for name in given(args)} | getattr(args, "renamed", {})
        print(f"remat: {in_cli_terms(one_line(exc), flags)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.traceback:
            raise
        print(f"remat: {type(exc).__name__}: {one_line(exc)} (rerun with --traceback for where)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
