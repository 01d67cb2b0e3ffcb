"""Compile-time cost: remat.compile's first training step beside torch.compile's, cold and warm, on the CPU.

    python -m bench.compile_time                           # demo, gpt-2, gpt-12, gpt-48
    python -m bench.compile_time --models demo gpt-12 --repeats 3
    python -m bench.compile_time --models gpt-2 --out smoke-results
    python -m bench.compile_time --models hf-llama hf-t5   # any bench model, at python -m bench's CPU size
    python -m bench --compile-time                         # the same, from the bench entry point

Per model and compiler (``torch.compile(model)`` with default options,
``remat.compile(model, budget_gb=B)`` at a binding budget B) a fresh Python
process runs the first training step (``compiled(*inputs).backward()``) and
times it from just before the call to just after ``backward`` returns. Cold:
every cache empty, in a temporary folder tree of the pair's own
(``TORCHINDUCTOR_CACHE_DIR``, ``REMAT_PLAN_CACHE``, ``REMAT_COST_CACHE``);
warm: a second process for the same pair with the same folders. B is half
way between the smallest feasible budget and store-all, planned in this
process (untimed, ``compiler="eager"``, plan cache off). With ``--repeats N``
each pair is run cold then warm N times, in fresh folders each time, and the
medians are reported. Writes <date>-cpu-compile-time.{json,md} into --out;
the markdown checks the targets (remat / torch at most 1.5 cold, 1.2 warm).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import pathlib
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

import torch

import remat
from bench.models import SIZES, build
from remat.demo import CPU_SIZE
from remat.errors import GIB

GPT_SIZE = {"d_model": 256, "heads": 8, "seq": 256, "vocab": 1024, "batch": 2}
DEPTHS = (2, 12, 48)
COMPILERS = ("torch", "remat")
PHASES = ("cold", "warm")
TARGETS = {"cold": 1.5, "warm": 1.2}  # most remat / torch first-step seconds
CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "REMAT_PLAN_CACHE": "plans", "REMAT_COST_CACHE": "costs"}
ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTE = ("Wall clock on a shared machine: each number is one process's first training step (capture, "
        "planning, code generation, the step itself); Python's and torch's import are not in it.")

Outcome = dict[str, Any]  # {"status": "ok"|"timeout"|"error", "seconds": float|None, ...}


# ---- models and budgets (parent process) ----

def model_size(name: str) -> tuple[str, dict[str, Any]]:
    """The model to build and its size: ``demo``, remat.demo's CPU model; ``gpt-L``, the GPT-style
    model with L layers; any other bench model (``hf-t5``, ``llama``, ...) at ``python -m bench``'s
    CPU size."""
    if name == "demo":
        return "gpt", dict(CPU_SIZE)
    prefix, _, layers = name.partition("-")
    if prefix == "gpt" and layers.isdigit():
        return "gpt", {"layers": int(layers), **GPT_SIZE}
    if name in SIZES["cpu"]:
        return name, dict(SIZES["cpu"][name])
    raise ValueError(f"unknown model {name!r}: 'demo', 'gpt-<layers>' or one of {sorted(SIZES['cpu'])}")


def build_model(model: str, size: dict[str, Any]) -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(0)
    return build(model, "cpu", size)


def default_models(depths: list[int]) -> list[str]:
    return ["demo", *(f"gpt-{layers}" for layers in depths)]


def cache_env(root: pathlib.Path) -> dict[str, str]:
    """The cache variables pointing into ``root``, one subfolder each."""
    return {name: str(root / sub) for name, sub in CACHE_VARS.items()}


@contextlib.contextmanager
def scoped_env(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then restore them."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def binding_budget_gb(model_name: str, size: dict[str, Any]) -> float:
    """Half way between the smallest feasible budget and store-all, planned with no cache written."""
    with tempfile.TemporaryDirectory() as tmp, scoped_env(cache_env(pathlib.Path(tmp)) | {"REMAT_PLAN_CACHE": "off"}):
        model, inputs = build_model(model_name, size)
        report = remat.plan(model, *inputs, compiler="eager")
        return report.budget_at(0.5) / GIB


# ---- the worker (one fresh process per first step) ----

def first_step(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, compile and time the first training step; the worker's JSON result."""
    model, inputs = build_model(spec["model"], spec["size"])
    if spec["compiler"] == "torch":
        compiled = torch.compile(model)
    else:
        compiled = remat.compile(model, budget_gb=spec["budget_gb"])
    start = time.perf_counter()
    loss = compiled(*inputs)
    loss.backward()
    result: dict[str, Any] = {"seconds": time.perf_counter() - start, "threads": torch.get_num_threads(),
                              "torch_caches": torch_cache_counts()}
    if spec["compiler"] == "remat":
        report = remat.reports(compiled)[0]
        result.update(plan_cache=report.plan_cache, recomputed=len(report.recomputed),
                      timings={phase: round(seconds, 3) for phase, seconds in report.timings.items()})
    return result


def torch_cache_counts() -> dict[str, int]:
    """Hits, misses and bypasses of Inductor's FX graph cache and AOTAutograd's cache in this process."""
    from torch._dynamo.utils import counters

    names = {"inductor": "fxgraph_cache_", "aot_autograd": "autograd_cache_"}
    return {key: count for group, prefix in names.items() for key, count in counters[group].items()
            if key.startswith(prefix) and count}


def worker_command(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "bench.compile_time", "--worker", "--spec", json.dumps(spec)]


def scrub(text: str, paths: dict[str, str]) -> str:
    """``text`` with each path (key) replaced by its placeholder (value), so no local path is recorded."""
    for path, placeholder in sorted(paths.items(), key=lambda item: -len(item[0])):
        if path:
            text = text.replace(path, placeholder)
    return text


def last_json_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return None


def run_command(command: list[str], env: dict[str, str], timeout: float, private: dict[str, str]) -> Outcome:
    """Run one worker in its own process group; a timeout kills the group and is recorded as such."""
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": "timeout", "seconds": None, "timeout_s": timeout}
    result = last_json_line(stdout)
    if proc.returncode != 0 or result is None:
        lines = [line for line in stderr.strip().splitlines() if line.strip()] or [f"exit status {proc.returncode}"]
        return {"status": "error", "seconds": None, "error": scrub(lines[-1], private)[:500]}
    return {"status": "ok", **result}


def private_paths(tmp: pathlib.Path) -> dict[str, str]:
    return {str(tmp): "<tmp>", str(ROOT): "<repo>", str(pathlib.Path.home()): "~"}


def cold_and_warm(spec: dict[str, Any], timeout: float) -> dict[str, Outcome]:
    """Two fresh processes sharing one fresh cache tree: the first finds every cache empty."""
    with tempfile.TemporaryDirectory(prefix="remat-ctime-") as tmp:
        root = pathlib.Path(tmp)
        env = {**os.environ, **cache_env(root)}
        private = private_paths(root)
        return {phase: run_command(worker_command(spec), env, timeout, private) for phase in PHASES}


# ---- summaries ----

def combine(outcomes: list[Outcome]) -> Outcome:
    """The median of the repeats' seconds; a timeout or error in any repeat is the summary's status."""
    bad = next((o for o in outcomes if o["status"] != "ok"), None)
    caches = sorted({o["plan_cache"] for o in outcomes if "plan_cache" in o})
    summary: Outcome = {"status": bad["status"] if bad else "ok",
                        "seconds": None if bad else round(statistics.median(o["seconds"] for o in outcomes), 3),
                        "runs": outcomes}
    if caches:
        summary["plan_cache"] = "/".join(c or "none" for c in caches)
    return summary


def ratio(remat_outcome: Outcome, torch_outcome: Outcome) -> float | None:
    remat_s, torch_s = remat_outcome.get("seconds"), torch_outcome.get("seconds")
    if remat_s is None or not torch_s:
        return None
    return round(remat_s / torch_s, 3)


def verdict(value: float | None, target: float) -> str:
    return "n/a" if value is None else ("meets" if value <= target else "misses")


def model_row(name: str, size: dict[str, Any], budget_gb: float, runs: dict[str, dict[str, Outcome]]) -> dict:
    """One model's result: per compiler and phase the combined outcome, then the ratios and verdicts."""
    row: dict[str, Any] = {"model": name, "size": size, "budget_gb": round(budget_gb, 6), **runs}
    row["ratio"] = {phase: ratio(runs["remat"][phase], runs["torch"][phase]) for phase in PHASES}
    row["verdict"] = {phase: verdict(row["ratio"][phase], TARGETS[phase]) for phase in PHASES}
    return row


# ---- output ----

def command_line(argv: list[str]) -> str:
    return " ".join(["python -m bench.compile_time", *([shlex.join(argv)] if argv else [])])


def cpu_description() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def seconds_cell(outcome: Outcome) -> str:
    return f"{outcome['seconds']:.1f}" if outcome["status"] == "ok" else outcome["status"]


def ratio_cell(value: float | None, verdict_text: str) -> str:
    return "" if value is None else f"{value:.2f} ({verdict_text})"


def table(rows: list[dict]) -> str:
    head = ("| model | torch cold s | remat cold s | ratio | torch warm s | remat warm s | ratio "
            "| remat warm plan cache |\n" + "|---" * 8 + "|\n")
    return head + "".join(
        f"| {r['model']} | {seconds_cell(r['torch']['cold'])} | {seconds_cell(r['remat']['cold'])} "
        f"| {ratio_cell(r['ratio']['cold'], r['verdict']['cold'])} | {seconds_cell(r['torch']['warm'])} "
        f"| {seconds_cell(r['remat']['warm'])} | {ratio_cell(r['ratio']['warm'], r['verdict']['warm'])} "
        f"| {r['remat']['warm'].get('plan_cache', '')} |\n" for r in rows)


def sizes_list(rows: list[dict]) -> str:
    return "".join(f"- {r['model']}: `{json.dumps(r['size'])}`, budget {r['budget_gb']:.4f} GiB\n" for r in rows)


def markdown(meta: dict, rows: list[dict]) -> str:
    targets = ", ".join(f"{phase} ratio <= {limit:g}" for phase, limit in TARGETS.items())
    return (f"# Compile time, remat beside torch.compile, {meta['date']}\n\n"
            f"Command: `{meta['command']}`\n\ntorch {meta['torch']}, Python {meta['python']}, CPU: {meta['cpu']} "
            f"({meta['threads']} torch threads); median of {meta['repeats']} repeat(s), timeout {meta['timeout_s']:g} s.\n\n"
            f"First training step in seconds, cold (every cache empty) and warm (a second process with the "
            f"first's caches). Ratio: remat / torch; targets: {targets}.\n\n{NOTE}\n\n"
            f"{table(rows)}\nModels (float32) and remat's budget (half way between the smallest "
            f"feasible and store-all):\n\n{sizes_list(rows)}")


def write(out: pathlib.Path, meta: dict, rows: list[dict]) -> pathlib.Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{meta['date']}-cpu-compile-time"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    stem.with_suffix(".md").write_text(markdown(meta, rows))
    return stem.with_suffix(".md")


# ---- driver ----

def measure_model(name: str, args: argparse.Namespace) -> dict:
    model, size = model_size(name)
    budget_gb = binding_budget_gb(model, size)
    print(f"{name}: budget {budget_gb:.4f} GiB", flush=True)
    outcomes: dict[str, dict[str, list[Outcome]]] = {c: {p: [] for p in PHASES} for c in COMPILERS}
    for _ in range(args.repeats):
        for compiler in COMPILERS:
            spec = {"model": model, "size": size, "compiler": compiler, "budget_gb": budget_gb if compiler == "remat" else None}
            for phase, outcome in cold_and_warm(spec, args.timeout).items():
                outcomes[compiler][phase].append(outcome)
                print(f"  {compiler} {phase}: {seconds_cell(outcome)} {outcome.get('plan_cache', '')}", flush=True)
    runs = {c: {p: combine(outcomes[c][p]) for p in PHASES} for c in COMPILERS}
    return model_row(name, size, budget_gb, runs)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compile_time", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=None, help="demo, gpt-<layers> or bench models (default: demo and --layers)")
    p.add_argument("--layers", type=int, nargs="+", default=list(DEPTHS), help="depths of the default gpt models")
    p.add_argument("--repeats", type=int, default=1, help="cold/warm runs per pair; the median is reported")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a worker is killed")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def meta_of(args: argparse.Namespace, argv: list[str]) -> dict:
    return {"date": dt.date.today().isoformat(), "device": "cpu", "cpu": cpu_description(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "command": command_line(argv), "repeats": args.repeats, "timeout_s": args.timeout, "targets": TARGETS}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.worker:
        print(json.dumps(first_step(json.loads(args.spec))), flush=True)
        return
    models = args.models or default_models(args.layers)
    for name in models:
        model_size(name)  # an unknown name fails before any work
    rows = [measure_model(name, args) for name in models]
    path = write(pathlib.Path(args.out), meta_of(args, argv), rows)
    print(table(rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
