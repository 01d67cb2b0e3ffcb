"""A peak diff: what three programs of one model hold at their peak, buffer by buffer.

    python -m bench.peak_diff llama                          # bench's CPU size: 4 layers, d=256, seq 256
    python -m bench.peak_diff gpt-softmax --seq 256 --out    # writes bench/results/<date>-peak-diff-gpt-softmax.md
    python -m bench.peak_diff gpt --layers 2 --width 64 --seq 64 --batch 2   # a small one, about a minute

On the same model and batch (CPU, float32):

- (a) eager, ``torch.utils.checkpoint`` around each block (``use_reentrant=False``);
- (b) ``torch.compile`` (Inductor) of that same checkpointed model;
- (c) remat at its smallest feasible budget (``remat.compile(model, budget_gb=<smallest>)``, the
  smallest read from ``remat.plan(model, *inputs).min_feasible_bytes``).

For each: the buffers alive at its peak, each with its size, what made it (the module, the ATen op;
under Inductor the generated buffer and the FX node whose value it holds), where it was born and where
it is freed; then what (b) and (c) hold at their peak beyond (a), grouped by role and module, and the
three peaks as the budget counts them (``remat.measure.budget_peak``: allocator peak during the step
above what was allocated before, plus the parameters, buffers and batch).

(a)'s live set is read from the CPU profiler's memory events (allocations and frees paired by address;
each attributed to the innermost ATen op around it, the module whose forward ran it, and in the backward
the autograd node, named with the module of its forward op). (b)'s and (c)'s come from the programs
Inductor generated, walked storage by storage as ``passes/program/inductor_account.py`` walks them for the
budget, with two corrections its walk lacks on ``torch.compile``'s checkpointed SDPA programs (an
extern kernel's nested tuple output no line allocates; RNG states handed to the backward under other
names). Each compiled live set is checked against the profiler's live set at the measured peak, size
by size; the test checks that every live set adds up to its measured peak (``tests/test_peak_diff.py``).
"Event N" is the N-th memory event of a program's walk (allocations, aliases, frees, kernel scratch),
not a wrapper line.

Roles: ``held`` (parameters, buffers, the batch), ``forward`` (born in the forward, peak in the forward),
``kept`` (born in the forward, alive at a backward peak: saved for the backward, or a checkpoint's block
input), ``recomputed`` (a forward op run again in the backward), ``backward`` (activation gradients and
temporaries, the loss's gradient), ``gradient`` (parameter gradients), ``scratch`` (an extern kernel's
workspace, as remat profiled it), ``before`` (memory allocated before the step and freed during it:
subtracted).

The parts (each module short): ``bench/peak_diff_live_set.py`` (the buffers and names shared),
``bench/peak_diff_eager.py`` (a), ``bench/peak_diff_compiled.py`` (b) and (c), reading Inductor's
programs with ``bench/peak_diff_replay.py``, and ``bench/peak_diff_report.py`` (the markdown); this
module runs the three and writes the report.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import platform
from typing import Any

import torch
from torch import nn

from bench.__main__ import SIZES
from bench.peak_diff_compiled import compiled_live_set, remat_live_set
from bench.peak_diff_eager import eager_live_set
from bench.peak_diff_live_set import PROGRAMS, LiveSet
from bench.peak_diff_report import diff_table, markdown, peaks_table
from remat import zoo


def live_sets(model: nn.Module, inputs: tuple, programs: tuple[str, ...] = PROGRAMS) -> dict[str, LiveSet]:
    """The live sets at the peak of the programs asked for, on the same model and batch."""
    make = {"a": eager_live_set, "b": compiled_live_set, "c": remat_live_set}
    return {p: make[p](model, inputs) for p in programs}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peak_diff", description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=[m for m in zoo.names() if m in ("gpt", "gpt-softmax", "llama", "vit")],
                        help="a zoo model with a .blocks list to checkpoint")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--width", type=int, help="d_model")
    parser.add_argument("--programs", nargs="+", choices=PROGRAMS, default=list(PROGRAMS))
    parser.add_argument("--out", nargs="?", const="bench/results", default=None,
                        help="write <date>-peak-diff-<model>.md into this folder (bench/results if none given)")
    return parser.parse_args(argv)


def size_of(args: argparse.Namespace) -> dict[str, Any]:
    """bench's CPU size for the model, with the flags given over it."""
    size = dict(SIZES["cpu"].get(args.model, {}))
    flags = {"batch": args.batch, "seq": args.seq, "layers": args.layers, "d_model": args.width}
    size.update({k: v for k, v in flags.items() if v is not None})
    return size


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    size = size_of(args)
    model, inputs = zoo.build(args.model, **size)
    sets = live_sets(model, inputs, tuple(args.programs))
    today = dt.date.today().isoformat()
    flags = "".join(f" --{k} {v}" for k, v in (("batch", args.batch), ("seq", args.seq), ("layers", args.layers),
                                                 ("width", args.width)) if v is not None)
    command = f"python -m bench.peak_diff {args.model}{flags}" + (
        f" --programs {' '.join(args.programs)}" if tuple(args.programs) != PROGRAMS else "")
    title = (f"Peak diff, {args.model}, {today}, CPU, torch {torch.__version__}, python {platform.python_version()}, "
             f"float32, {', '.join(f'{k}={v}' for k, v in size.items())}")
    text = markdown(sets, title, command, written=args.out is not None)
    if args.out is None:
        print(text)
    else:
        path = pathlib.Path(args.out) / f"{today}-peak-diff-{args.model}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(peaks_table(sets) + "\n" + diff_table(sets) + f"\nwrote {path}")
    return text


if __name__ == "__main__":
    main()
