"""A caller profiling remat steps, in a fresh process (tests/test_profiler_safety.py):
``python -m tests.profiler_worker SCENARIO OUT``.

Each scenario profiles the first step (the one remat compiles and measures on) and exports every
trace to ``OUT``; it writes what each trace holds to ``OUT/result.json``. A crash (remat's profiler
stopping the caller's made ``export_chrome_trace`` segfault) shows as the process's exit status.
The test turns the plan and cost caches off, so remat really measures op costs here.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import remat
from remat.errors import GIB

CALLER_MARK = "caller::step"
# an op the profile pass runs alone, several times, to time it; the compiled step fuses it into a kernel of
# Inductor's, so the caller's trace holds it only from tracing: as often where remat measures op costs as
# where it costs them analytically
MEASURED_OP = "aten::erf"


def trace_facts(path: Path) -> dict[str, Any]:
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and isinstance(e.get("tid"), int)]
    return {"caller_mark": any(e["name"] == CALLER_MARK for e in ops),
            "memory_events": sum(e.get("name") == "[memory]" for e in events),
            "measured_op": sum(e["name"] == MEASURED_OP for e in ops),
            "threads": sorted({e["tid"] for e in ops}), "caller_thread": threading.get_native_id()}


def mlp(width: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The issue's model; ``width`` varies it so each use measures its ops afresh."""
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, 64))
    return model, torch.randn(32, 64)


def profiled(out: Path, name: str, step: Any, **settings: Any) -> dict[str, Any]:
    """Run ``step`` in a profiler session of the caller's and export its trace."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, **settings) as prof:
        with record_function(CALLER_MARK):
            step()
    path = out / f"{name}.json"
    prof.export_chrome_trace(str(path))
    return trace_facts(path)


def snippet(out: Path) -> dict[str, Any]:
    """The model of the issue's snippet compiled with analytic costs (nothing measured), then the snippet
    itself (every op measured on the first step); then the snippet with ``record_shapes`` and under the
    autograd profiler."""
    result = {}
    for name, options in (("analytic", {"profile": "analytic"}), ("snippet", {})):
        torch._dynamo.reset()
        model, x = mlp(256)
        compiled = remat.compile(model, budget_gb=None, **options)
        result[name] = profiled(out, name, lambda: compiled(x).sum().backward())
    model, x = mlp(192)
    compiled = remat.compile(model, budget_gb=None)
    result["record_shapes"] = profiled(out, "record_shapes", lambda: compiled(x).sum().backward(), record_shapes=True)
    model, x = mlp(160)
    compiled = remat.compile(model, budget_gb=None)
    with torch.autograd.profiler.profile(profile_memory=True) as prof:
        with record_function(CALLER_MARK):
            compiled(x).sum().backward()
    prof.export_chrome_trace(str(out / "autograd_profiler.json"))
    result["autograd_profiler"] = trace_facts(out / "autograd_profiler.json")
    return result


def binding(out: Path) -> dict[str, Any]:
    """``remat.plan`` inside the caller's session, then a binding budget's first and second steps,
    each step profiled and exported on its own."""
    model, x = mlp(320)
    reports: list[remat.Report] = []
    result = {"plan": profiled(out, "plan", lambda: reports.append(remat.plan(model, x)))}
    compiled = remat.compile(model, budget_gb=reports[0].budget_at(0.3) / GIB)
    for step in (1, 2):
        result[f"step{step}"] = profiled(out, f"step{step}", lambda: compiled(x).sum().backward())
    result["recomputed"] = len(remat.reports(compiled)[0].recomputed)
    return result


def scheduled(out: Path) -> dict[str, Any]:
    """A Hugging Face GPT-2 built from a config, under a scheduled profiler whose warm-up is the step
    remat compiles and measures on: two active steps, exported by ``on_trace_ready``."""
    from bench import hf_models

    model, inputs = hf_models.build("hf-gpt2", layers=2, d_model=64, seq=32)
    compiled = remat.compile(model)
    traces: list[Path] = []

    def export(prof: Any) -> None:
        traces.append(out / f"scheduled{len(traces)}.json")
        prof.export_chrome_trace(str(traces[-1]))

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, on_trace_ready=export,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1)) as prof:
        for _ in range(3):
            with record_function(CALLER_MARK):
                compiled(*inputs).backward()
            prof.step()
    return {"traces": [trace_facts(path) for path in traces], "planned": len(remat.reports(compiled))}


SCENARIOS = {"snippet": snippet, "binding": binding, "scheduled": scheduled}


def main(scenario: str, out: str) -> None:
    folder = Path(out)
    result = SCENARIOS[scenario](folder)
    (folder / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
