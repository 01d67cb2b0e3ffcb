"""remat beside PyTorch's own memory options, one model at a time, in one run.

    python -m bench --device cuda                       # every model at realistic size, bf16 autocast
    python -m bench --device cpu --smoke                # tiny models: the harness end to end (not timing)
    python -m bench --device cpu --models gpt gpt-softmax
    python -m bench --scaling                           # solver scaling, GPT-style 2 to 48 layers, CPU
    python -m bench --compile-time                      # first-step compile time beside torch.compile, CPU
    python -m bench --fsdp                              # FSDP2 per-block on 2 CPU ranks: per-rank peak vs budget

Per model it writes <date>-<device>-<model>.{json,md,png} into --out (a
``-smoke`` before the model name for --smoke), and <date>-<device>-summary.md
with one line per model: at each peer's measured peak, remat's step time as a
ratio of the peer's. The smoke mode runs torch.compile's peers through the
``aot_eager_decomp_partition`` backend (torch's real partitioner, no code
generation) and remat with ``compiler="eager"``, so that it stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import datetime as dt
import json
import logging
import pathlib
import platform
import shlex
import sys
import time
from typing import Any

import torch

from bench import compile_time, fsdp, pareto, peers, render, scaling
from bench.models import SDPA_MODELS, SIZES, ZOO, build, default_models
from remat.cli import parse_overrides

CPU_NOTE = ("CPU step times come from a shared machine and are noisy: neither they nor the time targets below "
            "are evidence of speed; the memory columns are what this run measures well. Peaks are the CPU profiler's "
            "[memory] events during one step plus the graph's inputs.")
log = logging.getLogger("bench")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--smoke", action="store_true", help="tiny models and fast compilers: checks the harness")
    p.add_argument("--models", nargs="+", default=None, help=f"default: {' '.join(ZOO)} (+ hf-* with transformers)")
    p.add_argument("--peers", nargs="+", default=None, help="peers whose name contains any of these (default all)")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--steps", type=int, default=None, help="timed steps per row (default 10; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, 
                   help="warm-up steps per row, compile included (default 3; smoke 1)")
    p.add_argument("--headroom", type=float, default=None,
                   help="remat's headroom (fraction of the budget held back); default: remat's own for the compiler")
    p.add_argument("--no-sweep", action="store_true", help="skip remat's own budget sweep")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="wall-clock budget for all models; rows past a model's share are recorded as skipped "
                        "(default 8 on CUDA, none on the CPU)")
    p.add_argument("--scaling", action="store_true", help="run the solver-scaling benchmark instead (CPU)")
    p.add_argument("--compile-time", action="store_true",
                   help="run the compile-time benchmark instead (CPU; --models demo gpt-<layers>, --layers)")
    p.add_argument("--render", nargs="+", default=None, metavar="JSON",
                   help="rewrite the markdown and plot of these result files from their rows")
    p.add_argument("--fsdp", action="store_true",
                   help="run the FSDP2 per-block benchmark instead (2 CPU ranks, gloo; per-rank peak against budget)")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="depths for --scaling and --compile-time")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a size field of every model (e.g. layers=4); recorded in the results")
    return p.parse_args(argv)


def setup_for(args: argparse.Namespace) -> pareto.Setup:
    smoke = args.smoke
    return pareto.Setup(
        device=args.device,
        backend="aot_eager_decomp_partition" if smoke else "inductor",
        compiler="eager" if smoke else "inductor",
        warmup=args.warmup if args.warmup is not None else (1 if smoke else 3),
        steps=args.steps if args.steps is not None else (2 if smoke else 10),
        autocast=args.device == "cuda",
        headroom=args.headroom,
    )


def meta(args: argparse.Namespace, argv: list[str], model: str, size: dict[str, Any], setup: pareto.Setup) -> dict:
    cuda = args.device == "cuda"
    return {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
            "command": "python -m bench " + shlex.join(argv), "model": model, "size": size,
            "setup": dataclasses.asdict(setup) | {"deadline": None},
            "dtype": "float32 parameters, bf16 autocast" if cuda else "float32",
            "notes": [] if cuda else [CPU_NOTE]}


def as_dicts(rows: list[pareto.Row]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) | {"within_budget": r.within_budget} for r in rows]


def write(out: pathlib.Path, stem: str, info: dict, result: dict) -> str:
    """JSON, markdown and PNG for one model; returns its summary line."""
    return write_rows(out, stem, info, result["bounds"], as_dicts(result["rows"]))


def rerender(path: pathlib.Path) -> str:
    """Rewrite a result's markdown, plot and checks from its JSON rows (after the renderer changed)."""
    data = json.loads(path.read_text())
    return write_rows(path.parent, path.stem, data["meta"], data["bounds"], data["rows"])


def write_rows(out: pathlib.Path, stem: str, info: dict, bounds: dict, rows: list[dict[str, Any]]) -> str:
    model = info["model"]
    checks = render.targets(model, rows, sdpa=model in SDPA_MODELS)
    line = render.summary_line(model, rows)
    payload = {"meta": info, "bounds": bounds, "rows": rows, "matched": render.matched(rows),
               "targets": checks, "summary": line}
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=2, default=str))
    title = f"{model}, {info['device']}, torch {info['torch']}"
    if importlib.util.find_spec("matplotlib"):
        render.plot(out / f"{stem}.png", title, rows)
    else:
        log.warning("matplotlib is not installed: no plot for %s", model)
    notes = "".join(f"\n{n}\n" for n in info["notes"])
    (out / f"{stem}.md").write_text(
        f"# {title}, {info['date']}\n\nCommand: `{info['command']}`\n\nSize: `{json.dumps(info['size'])}`; "
        f"{info['dtype']}; {info['setup']['warmup']} warm-up steps, median of {info['setup']['steps']}.\n{notes}\n"
        f"{line}\n\n## Every row\n\n{render.table(rows)}\n## remat at each peer's measured peak\n\n"
        f"{render.matched_table(rows)}\n## Targets\n\n{render.targets_table(checks)}\n![Pareto]({stem}.png)\n")
    return line


def show(row: pareto.Row) -> None:
    """One progress line per measured row."""
    peak = "" if row.peak_bytes is None else f"{row.peak_bytes / 2**20:.1f} MiB"
    ms = "" if row.step_ms is None else f"{row.step_ms:.1f} ms"
    print(f"  {row.policy}: {row.status} {peak} {ms}", flush=True)


def run(args: argparse.Namespace, argv: list[str]) -> list[str]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    models = args.models or default_models()
    chosen = peers.select(args.peers)
    base = setup_for(args)
    sizes = SIZES["smoke" if args.smoke else args.device]
    minutes = args.max_minutes if args.max_minutes is not None else (8.0 if args.device == "cuda" else None)
    rows = pareto.row_count(len(chosen), sweep=not args.no_sweep)
    print(f"{len(models)} model(s) x at most {rows} rows ({len(chosen)} peers); "
          + (f"budget {minutes:g} min" if minutes else "no time budget"), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    today = dt.date.today().isoformat()
    kind = args.device + ("-smoke" if args.smoke else "")
    kind += f"-headroom{args.headroom:g}" if args.headroom is not None else ""
    start, lines = time.monotonic(), []
    for i, name in enumerate(models):
        deadline = float("inf")
        if minutes:
            left = start + 60 * minutes - time.monotonic()
            deadline = time.monotonic() + left / (len(models) - i)
        setup = dataclasses.replace(base, deadline=deadline)
        size = {**sizes.get(name, {}), **parse_overrides(args.set)}
        model, inputs = build(name, args.device, size)
        t0 = time.monotonic()
        result = pareto.run_model(model, inputs, chosen, setup, sweep=not args.no_sweep, progress=show)
        lines.append(write(out, f"{today}-{kind}-{name}", meta(args, argv, name, size, setup), result))
        print(f"{lines[-1]}  [{time.monotonic() - t0:.0f} s]", flush=True)
        del model, inputs
    (out / f"{today}-{kind}-summary.md").write_text(
        f"# remat beside PyTorch's options, {today}, {kind}, torch {torch.__version__}\n\n"
        f"Command: `python -m bench {shlex.join(argv)}`\n\n" + "".join(f"- {line}\n" for line in lines))
    return lines


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    args = parse(argv)
    if args.render:
        for path in args.render:
            print(rerender(pathlib.Path(path)))
        return
    if args.scaling:
        scaling.main([*(["--layers", *map(str, args.layers)] if args.layers else []), "--out", args.out])
        return
    if args.compile_time:
        compile_time.main([*(["--models", *args.models] if args.models else []),
                           *(["--layers", *map(str, args.layers)] if args.layers else []), "--out", args.out])
        return
    if args.fsdp:
        fsdp.main(["--out", args.out])
        return
    run(args, argv)


if __name__ == "__main__":
    main()
