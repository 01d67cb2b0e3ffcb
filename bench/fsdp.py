"""FSDP2 with each block compiled, on 2 CPU ranks (gloo): each rank's measured step peak against
the budget, for remat (per-rank and per-graph budgets) and for torch's own options.

    python -m bench.fsdp                       # a 4-layer GPT-style model, Inductor
    python -m bench.fsdp --compiler eager      # remat's graphs op by op (fast)
    python -m bench --fsdp                     # the same, from the bench entry point

The parent launches two ranks of this module (``--rank``). Each row builds the same model, wraps it
in torchtitan's order (checkpoint wrap where the row asks, compile each block, ``fully_shard`` each
block, then the root) and runs 3 training steps; a rank's peak is the CPU profiler's peak above
what was allocated before the step plus the local shards held then (gradients set to None before
each step), the row's figure the larger of the two ranks'. remat's budgets are taken between its
per-rank smallest feasible budget and store-all, planned on rank 0 with no budget. Writes
<date>-cpu-fsdp.{json,md} into --out.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import pathlib
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

MODEL = {"layers": 4, "d_model": 128, "heads": 4, "seq": 128, "vocab": 1024, "batch": 4}
FRACTIONS = (0.25, 0.5)
STEPS = 3
LIMIT_S = 1500


def sharded(base: torch.nn.Module, compile_block: Any, wrap: bool = False) -> torch.nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    torch._dynamo.reset()
    model = copy.deepcopy(base)
    for i, block in enumerate(model.blocks):
        if wrap:
            block = model.blocks[i] = checkpoint_wrapper(block)
        if compile_block is not None:
            compile_block(block)
        fully_shard(block)
    fully_shard(model)
    return model


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a parameter or gradient (the tensor itself when not sharded)."""
    return t.to_local() if hasattr(t, "to_local") else t


def shard_bytes(model: torch.nn.Module) -> int:
    """The bytes of this rank's parameter shards."""
    return sum(local(p).untyped_storage().nbytes() for p in model.parameters())


def step_peaks(model: torch.nn.Module, inputs: tuple) -> tuple[int, list[float]]:
    """The rank's measured step peak over ``STEPS`` steps and each step's seconds: the CPU profiler's
    peak above what was allocated before the step (gradients set to None first), the largest of
    the steps, plus the local shards held then."""
    from remat.measure import cpu_step_peak

    shards = shard_bytes(model)
    peaks, times = [], []
    for _ in range(STEPS):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        peaks.append(cpu_step_peak(lambda: model(*inputs).backward()))
        times.append(time.perf_counter() - t0)
    return max(peaks) + shards, times


def run(model: torch.nn.Module, inputs: tuple) -> dict[str, Any]:
    """3 steps (after two: the first compiles, and under remat measures the eager head and loss,
    which the second counts, planning again where they do not fit): the larger measured peak, the
    median step time."""
    for _ in range(2):
        model(*inputs).backward()
    peak, times = step_peaks(model, inputs)
    return {"peak_bytes": peak, "step_s": statistics.median(times)}


def rank_main(rank: int, port: int, out: pathlib.Path, compiler: str) -> None:
    import torch.distributed as dist

    import remat
    from remat.errors import GIB
    from remat.zoo import build

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=dt.timedelta(seconds=600))
    torch.manual_seed(0)
    base, inputs = build("gpt", **MODEL)
    rows: list[dict[str, Any]] = []

    def remat_blocks(options: dict[str, Any]) -> Any:
        return lambda block: block.compile(backend="remat", options={"compiler": compiler, **options})

    def row(name: str, model: torch.nn.Module, budget: int | None = None, report: Any = None) -> None:
        measured = run(model, inputs)
        rows.append({"row": name, "budget_bytes": budget, **measured,
                     "predicted_bytes": None if report is None else report.checked_peak_bytes})

    row("eager FSDP2", sharded(base, None))
    row("torch.compile per block", sharded(base, lambda b: b.compile()))
    row("torch.compile per block, checkpoint each block", sharded(base, lambda b: b.compile(), wrap=True))
    before = len(remat.reports())
    planned = sharded(base, remat_blocks({}))
    for _ in range(2):  # the second step counts the eager head and loss in the report
        planned(*inputs).backward()
    report = remat.reports()[before]
    budgets = [[report.budget_at(f) for f in FRACTIONS]]
    dist.broadcast_object_list(budgets, src=0)
    for fraction, budget in zip(FRACTIONS, budgets[0]):
        for scope in ("rank", "graph"):
            before = len(remat.reports())
            model = sharded(base, remat_blocks({"budget_gb": budget / GIB, "budget_scope": scope}))
            model(*inputs).backward()
            row(f"remat budget_scope={scope}, budget at {fraction:.2f}", model, budget, remat.reports()[before])
    rows = [{**r, "peak_bytes": peak} for r, peak in zip(rows, largest_across_ranks([r["peak_bytes"] for r in rows]))]
    if rank == 0:
        (out / "rows.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def largest_across_ranks(peaks: list[int]) -> list[int]:
    import torch.distributed as dist

    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, peaks)
    return [max(a, b) for a, b in zip(*gathered)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(compiler: str, work: pathlib.Path) -> list[dict[str, Any]]:
    port = free_port()
    env = {**os.environ, "REMAT_PLAN_CACHE": "off", "REMAT_COST_CACHE": "off"}
    command = [sys.executable, "-m", "bench.fsdp", "--compiler", compiler, "--port", str(port), "--work", str(work)]
    procs = [subprocess.Popen([*command, "--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(2)]
    for r, p in enumerate(procs):
        log = p.communicate(timeout=LIMIT_S)[0]
        if p.returncode != 0:
            raise SystemExit(f"rank {r} failed:\n{log[-4000:]}")
    return json.loads((work / "rows.json").read_text())


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    mib = 2 ** 20
    lines = [f"# FSDP2 per-block compile, 2 CPU ranks ({meta['date']})", "",
             f"`{meta['command']}`; torch {meta['torch']}, {meta['machine']}; model gpt {meta['model']}; "
             f"remat compiler {meta['compiler']}.", "",
             "| row | budget MiB | predicted MiB | measured peak MiB (larger rank) | measured / budget | step s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        budget = "" if r["budget_bytes"] is None else f"{r['budget_bytes'] / mib:.2f}"
        ratio = "" if r["budget_bytes"] is None else f"{r['peak_bytes'] / r['budget_bytes']:.2f}"
        predicted = "" if r["predicted_bytes"] is None else f"{r['predicted_bytes'] / mib:.2f}"
        lines.append(f"| {r['row']} | {budget} | {predicted} | {r['peak_bytes'] / mib:.2f} | {ratio} | {r['step_s']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fsdp", description=__doc__.split("\n")[0])
    p.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank is not None:
        rank_main(args.rank, args.port, pathlib.Path(args.work), args.compiler)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        rows = launch(args.compiler, pathlib.Path(work))
    date = dt.date.today().isoformat()
    meta = {"date": date, "torch": torch.__version__, "machine": platform.machine(), "model": MODEL,
            "compiler": args.compiler, "command": " ".join(["python -m bench.fsdp", shlex.join(argv or sys.argv[1:])]).strip()}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{date}-cpu-fsdp.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / f"{date}-cpu-fsdp.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
