"""remat never disturbs the caller's tools: their profiler, their random stream, their settings.

The profiled steps run in fresh processes (``tests/profiler_worker.py``) with the plan and cost caches
off, so the first step really measures; remat's profiler once stopped the caller's there and the
caller's ``export_chrome_trace`` crashed the process. The FSDP2 variant is in tests/test_ranks.py; the
CUDA ones (the caller's ``max_memory_allocated`` and memory history) in tests/test_cuda.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

import remat
from remat.measure import step_peak
from remat.passes.costs import profile as profile_pass
from remat.passes.costs.timing import MIN_SAMPLES
from remat.passes import torch_adapter as adapter

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKER_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every scenario of tests/profiler_worker.py, run side by side, each in a fresh process."""
    env = {**os.environ, "REMAT_PLAN_CACHE": "off", "REMAT_COST_CACHE": "off"}
    runs = {}
    for scenario in ("snippet", "binding", "scheduled"):
        out = tmp_path_factory.mktemp(scenario)
        runs[scenario] = (out, subprocess.Popen([sys.executable, "-m", "tests.profiler_worker", scenario, str(out)],
                                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True))
    results = {}
    for scenario, (out, proc) in runs.items():
        log = proc.communicate(timeout=WORKER_TIMEOUT_S)[0]
        results[scenario] = {"returncode": proc.returncode, "log": log[-4000:],
                             **(json.loads((out / "result.json").read_text()) if proc.returncode == 0 else {})}
    return results


def assert_callers_trace(trace: dict) -> None:
    """The trace holds the caller's own ops and memory events, on the caller's thread only."""
    assert trace["caller_mark"] and trace["memory_events"] > 0, trace
    assert trace["threads"] == [trace["caller_thread"]], trace


@pytest.mark.parametrize("scenario", ["snippet", "binding", "scheduled"])
def test_profiling_a_remat_step_exports_the_callers_trace(profiled: dict, scenario: str) -> None:
    result = profiled[scenario]
    assert result["returncode"] == 0, result["log"]
    traces = [value for key, value in result.items() if isinstance(value, dict) and "caller_mark" in value]
    traces += result.get("traces", [])
    assert traces
    for trace in traces:
        assert_callers_trace(trace)


def test_the_ops_remat_measures_are_not_in_the_callers_trace(profiled: dict) -> None:
    """Measuring every op on the first step adds none of its runs to the caller's trace: the trace of
    the step that measures holds the measured op no more often than that of a step costed analytically
    (whose tracing, run first, also fills torch's fake-tensor cache). A leak would add every timed run of
    the op, a warm-up and at least ``MIN_SAMPLES`` samples; the tracing itself has differed by one run
    between the two steps on a loaded machine (10 against 9)."""
    result = profiled["snippet"]
    assert result["snippet"]["measured_op"] < result["analytic"]["measured_op"] + MIN_SAMPLES, result


def test_a_binding_budget_plans_and_both_steps_export(profiled: dict) -> None:
    result = profiled["binding"]
    assert result["recomputed"] > 0  # the budget binds: the fitting loop and its program account ran
    assert result["step2"]["memory_events"] > 0


def test_a_scheduled_profiler_whose_warm_up_compiles_exports_its_active_steps(profiled: dict) -> None:
    result = profiled["scheduled"]
    assert len(result["traces"]) == 1 and result["planned"] == 1


def test_a_profiler_running_or_prepared_is_found() -> None:
    assert not adapter.caller_is_profiling()
    with profile(activities=[ProfilerActivity.CPU]):
        assert adapter.caller_is_profiling()
    seen = []
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=1)) as prof:
        for _ in range(3):  # waiting, warming up (prepared, not yet recording), recording
            seen.append(adapter.caller_is_profiling())
            prof.step()
    assert seen == [False, True, True]
    with torch.autograd.profiler.profile():
        assert adapter.caller_is_profiling()
    assert not adapter.caller_is_profiling()


def test_measuring_a_step_inside_the_callers_profiler_is_refused_with_what_to_do() -> None:
    with profile(activities=[ProfilerActivity.CPU]):
        with pytest.raises(adapter.ProfilerBusy, match="outside your profiler"):
            step_peak(lambda: torch.ones(1000), "cpu")


def test_the_measuring_thread_sees_the_same_bytes_as_a_step_measured_on_the_callers_thread() -> None:
    def op() -> None:
        a = torch.ones(1000, 1000)
        b = a * 2
        del a
        _ = b + 1  # a and b, then b and the sum: two 4 MB buffers at a time

    alone = step_peak(op, "cpu")
    with adapter.MeasuringThread(torch.device("cpu")) as thread:
        on_thread = thread.run(lambda: adapter.thread_memory_peak(op, torch.device("cpu")))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            beside_callers = thread.run(lambda: adapter.thread_memory_peak(op, torch.device("cpu")))
    assert alone == on_thread == beside_callers
    assert 8_000_000 <= alone < 8_000_000 + 64  # (and the scalars' wrapped tensors)


def test_the_measuring_thread_is_remats_own_and_returns_results_and_errors() -> None:
    with adapter.MeasuringThread(torch.device("cpu")) as thread:
        assert thread.run(threading.get_ident) != threading.get_ident()
        assert thread.run(torch.is_grad_enabled) is False and torch.is_grad_enabled()
        with pytest.raises(ZeroDivisionError):
            thread.run(lambda: 1 / 0)


def test_what_waits_for_the_backward_runs_as_it_returns_and_displaces_no_python_profiler() -> None:
    import sys

    seen: list[str] = []

    def hook(grad: torch.Tensor) -> None:
        seen.append("scheduled" if adapter.when_backward_returns(lambda: seen.append("ran")) else "refused")
        seen.append("in backward")

    x = torch.ones(3, requires_grad=True)
    y = x * 2
    y.register_hook(hook)
    y.sum().backward()
    assert seen == ["scheduled", "in backward", "ran"] and sys.getprofile() is None

    def callers_profiler(frame: object, event: str, arg: object) -> None:
        pass

    y = x * 2
    y.register_hook(hook)
    sys.setprofile(callers_profiler)
    try:
        y.sum().backward()
        assert sys.getprofile() is callers_profiler
    finally:
        sys.setprofile(None)
    assert seen[3:] == ["refused", "in backward"]


AMBIENT = {
    "grad": torch.is_grad_enabled,
    "autocast": lambda: (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
    "threads": torch.get_num_threads,
    "deterministic": lambda: (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()),
    "matmul precision": torch.get_float32_matmul_precision,
    "mkldnn": lambda: torch.backends.mkldnn.enabled,
    "default dtype": torch.get_default_dtype,
    "dispatch modes": torch._C._len_torch_dispatch_stack,
    "python profiler": lambda: __import__("sys").getprofile(),
    "profiler": adapter.caller_is_profiling,
}


@pytest.fixture(scope="module")
def first_step() -> dict[str, object]:
    """The caller's settings around remat's first step, which measures every op (shapes no other test
    uses, so no cost is known), run under non-default settings; and the random numbers drawn after it,
    beside those drawn after the same step run eagerly."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 136), torch.nn.GELU(), torch.nn.Linear(136, 24))
    x = torch.randn(16, 24)
    compiled = remat.compile(model, budget_gb=None)
    known = set(profile_pass.SHARED_TIMINGS.entries)
    settings = (torch.get_num_threads(), torch.get_float32_matmul_precision())
    torch.set_num_threads(max(1, settings[0] - 1) if settings[0] > 1 else 1)
    torch.set_float32_matmul_precision("medium")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            before = {name: read() for name, read in AMBIENT.items()}
            torch.manual_seed(1)
            compiled(x).float().sum().backward()
            after = {name: read() for name, read in AMBIENT.items()}
            drawn = torch.rand(8)
            torch.manual_seed(1)
            model(x).float().sum().backward()
            eager = torch.rand(8)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_float32_matmul_precision(settings[1])
        torch.set_num_threads(settings[0])
    measured = [entry for key, entry in profile_pass.SHARED_TIMINGS.entries.items() if key not in known]
    assert any(entry[3] for entry in measured), "the first step measured no op"
    return {"before": before, "after": after, "drawn": drawn, "eager": eager}


@pytest.mark.parametrize("setting", list(AMBIENT))
def test_the_first_step_leaves_the_callers_setting_as_it_was(first_step: dict, setting: str) -> None:
    assert first_step["after"][setting] == first_step["before"][setting]


def test_the_callers_random_stream_after_the_first_step_is_eagers(first_step: dict) -> None:
    torch.testing.assert_close(first_step["drawn"], first_step["eager"], rtol=0, atol=0)
