"""The eager head and loss of a rank's step, measured on the first step (passes/scope/eager_parts.py).

The 2-rank FSDP2 test is in tests/test_ranks.py; here the window's arithmetic, the watch's
decisions on a stand-in plan, and one process with a rank scope stood in for FSDP2's.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import remat
from remat.passes.scope import eager_parts, rank_scope
from remat.passes.scope.eager_parts import UNKNOWN, EagerParts, EagerWatch, peak_between_marks
from remat.passes.scope.step import STEP
from remat.solvers.errors import BudgetError
from remat.zoo import build

OPEN, END = eager_parts.EagerWindow.OPEN, eager_parts.EagerWindow.END


def memory(ts: int, nbytes: int, total: int) -> dict[str, Any]:
    return {"name": "[memory]", "ts": ts, "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": 0}}


def test_the_window_runs_from_the_last_open_before_the_end_and_counts_above_what_was_allocated_there() -> None:
    trace = [memory(1, 100, 100), {"name": OPEN, "ts": 2}, memory(3, 500, 600), memory(4, -500, 100),
             {"name": OPEN, "ts": 5}, memory(6, 300, 400), memory(7, 200, 600), memory(8, -500, 100),
             {"name": END, "ts": 9}, memory(10, 5000, 5100), {"name": OPEN, "ts": 11}]
    assert peak_between_marks(trace, OPEN, END) == 500  # 600 at most after the second open, 100 there
    assert peak_between_marks([memory(1, 10, 10)], OPEN, END) == UNKNOWN


def one_window(window: eager_parts.EagerWindow) -> torch.Tensor:
    """A graph's output, a head and loss on it (its window), and their backward, as a step runs them."""
    x = torch.ones(64, 64, requires_grad=True)
    window.arm(x.device)
    out = x * 1  # the graph's output
    window.open(out.device, out.numel() * out.element_size())
    out.register_hook(lambda grad: window.end())
    head = out @ torch.ones(64, 4096)  # 1 MiB of logits
    head.logsumexp(dim=1).sum().backward()
    return x


def test_the_window_is_measured_and_its_profiler_stopped_as_the_backward_returns() -> None:
    window = eager_parts.EagerWindow()
    one_window(window)
    assert not torch._C._autograd._profiler_enabled()  # stopped after the backward, not brought back by it
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):  # the caller's, next
        torch.ones(8).sum()
    logits = 64 * 4096 * 4
    assert 2 * logits <= window.close() < 8 * logits  # the logits, their weight, gradient and temporaries


def test_a_window_opened_while_the_caller_profiles_is_deferred_and_leaves_the_callers_session_alone(
        tmp_path: Any) -> None:
    window = eager_parts.EagerWindow()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        one_window(window)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    assert window.close() == eager_parts.DEFERRED and (tmp_path / "trace.json").stat().st_size > 0


@dataclass
class StandInPlan:
    """A compiled plan whose program's forward end is unknown: with eager bytes it peaks that
    much higher (``peaks.rank_peak_with``)."""

    compiled_peak_bytes: int
    target: int
    budget: int
    notes: tuple[str, ...] = ()
    program = None
    solution = type("S", (), {"saved": frozenset()})()
    scope = rank_scope.RankScope("FSDP2")

    @property
    def request(self) -> Any:
        return type("R", (), {"budget_bytes": self.budget})()

    def noted(self, *notes: str) -> StandInPlan:
        return dataclasses.replace(self, notes=self.notes + notes)


def watch_one_step(plan: StandInPlan, eager: int, replan: Any) -> tuple[EagerWatch, list[EagerParts]]:
    """A watch over an identity 'graph': one step whose head allocates ``eager`` bytes (the
    window's reading is stood in), then the next call."""
    recounted: list[EagerParts] = []
    watch = EagerWatch(lambda x: (x * 1,), plan, replan, lambda now, eager: recounted.append(eager) or now,
                       lambda old, new: None)
    x = torch.ones(3, requires_grad=True)
    (out,) = watch(x)
    watch.window.cancel()
    watch.window.peak = eager  # what a CUDA window reads at the gradient's arrival
    out.sum().backward()
    assert watch.state is eager_parts.State.COUNTING
    watch(x)
    return watch, recounted


def test_a_plan_that_still_fits_with_the_eager_bytes_is_recounted_not_replanned() -> None:
    plan = StandInPlan(compiled_peak_bytes=600, target=1000, budget=1000)
    watch, recounted = watch_one_step(plan, 300, replan=lambda now, eager: pytest.fail("planned again"))
    assert recounted == [EagerParts(300, copies=0)] and watch.state is eager_parts.State.DONE  # one call a step


def test_a_plan_over_the_budget_with_them_is_replanned_and_its_program_used_from_then_on() -> None:
    plan = StandInPlan(compiled_peak_bytes=800, target=1000, budget=1000)
    asked: list[int] = []

    again = StandInPlan(compiled_peak_bytes=700, target=1000, budget=1000)

    def replan(now: StandInPlan, eager: EagerParts) -> Any:
        asked.append(eager.peak)
        return (lambda x: (x * 2,)), again

    watch, recounted = watch_one_step(plan, 300, replan)
    assert asked == [300] and not recounted and watch.plan is again
    assert torch.equal(watch(torch.ones(2))[0], torch.full((2,), 2.0))


def test_a_budget_no_plan_fits_with_them_is_refused_naming_the_eager_parts() -> None:
    def replan(now: StandInPlan, eager: EagerParts) -> Any:
        raise BudgetError("budget 1000 B is below the smallest feasible budget 1500 B", budget_bytes=1000,
                          min_feasible_bytes=1500)

    with pytest.raises(BudgetError, match="eager parts of the step") as caught:
        watch_one_step(StandInPlan(compiled_peak_bytes=800, target=1000, budget=1000), 700, replan)
    assert caught.value.min_feasible_bytes == 1500


def test_a_window_not_measured_counts_nothing_and_says_so() -> None:
    plan = StandInPlan(compiled_peak_bytes=800, target=1000, budget=1000)
    watch, recounted = watch_one_step(plan, UNKNOWN, replan=lambda now, eager: pytest.fail("planned again"))
    assert not recounted and any("not measured" in n for n in watch.plan.notes) and not plan.notes


def test_one_process_measures_its_eager_head_and_plans_again_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks compiled one by one under a rank scope (stood in for FSDP2's): the first step
    measures the head and loss on the CPU (the profiler's memory events) and the second plans
    with them; the gradients stay eager's."""
    monkeypatch.setattr(rank_scope, "scope_of", lambda gm, inputs, scope: rank_scope.RankScope("FSDP2", copies=1))
    torch.manual_seed(0)
    model, inputs = build("gpt", layers=2, batch=4, seq=64, vocab=4096)
    reference = copy.deepcopy(model)
    torch._dynamo.reset()
    before = len(remat.reports())
    for block in model.blocks:
        block.compile(backend="remat", options={"compiler": "eager", "budget_gb": 1.0, "plan_cache": False})
    model(*inputs).backward()
    assert remat.reports()[before].eager_bytes == 0
    model.zero_grad(set_to_none=True)
    model(*inputs).backward()
    reference(*inputs).backward()
    (report,) = remat.reports()[before:]
    logits = 4 * 64 * 4096 * 4
    assert 2 * logits <= report.eager_bytes < 6 * logits  # the logits, their softmax and gradient
    assert report.predicted_peak_bytes >= report.eager_bytes and "eager head and loss" in report.summary()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_window_reports_what_it_leaves_alive_besides_the_outputs_gradients() -> None:
    trace = [{"name": OPEN, "ts": 1}, memory(2, 400, 400), memory(3, 100, 500), memory(4, -400, 100),
             {"name": END, "ts": 5}]
    assert eager_parts.window_of(trace, OPEN, END) == (500, 100)


def test_a_measured_step_scope_counts_the_calls_it_saw_and_remembers_the_largest_window() -> None:
    scope = rank_scope.RankScope(rank_scope.PROCESS, copies=3, copy_input_bytes=30, input_bytes=10, graph="g",
                                 eager_bytes=900, eager_reserved=True)
    counted = scope.with_eager(EagerParts(peak=500, after=40, copies=1, other_state=7))
    assert (counted.eager_bytes, counted.eager_after_bytes, counted.eager_reserved) == (500, 40, False)
    assert (counted.copies, counted.copy_input_bytes, counted.other_state_bytes) == (1, 10, 7)
    assert counted.outside_bytes == 10 + 40 + 7
    try:
        eager_parts.remember(counted)
        eager_parts.remember(scope.with_eager(EagerParts(peak=300, after=60, copies=1)))
        assert STEP.eager_after("g") == EagerParts(500, 60, 1, 7)
    finally:
        STEP.forget_measured()


def test_a_graph_that_fails_to_compile_stops_the_windows_open_before_it() -> None:
    """A graph break's next graph refused (its compile raises): the graphs before it see no backward, and
    their windows' profiler must not outlive the step."""
    plan = StandInPlan(compiled_peak_bytes=600, target=1000, budget=1000)
    plan.scope = rank_scope.RankScope(rank_scope.PROCESS)
    plan.problem = type("P", (), {"values": ()})()
    watch = EagerWatch(lambda x: (x * 1,), plan, lambda now, eager: pytest.fail("planned"),
                       lambda now, eager: now, lambda old, new: None)
    (out,) = watch(torch.ones(3, requires_grad=True))
    assert remat.passes.torch_adapter.OwnSession._running is not None
    eager_parts.abandon_open_windows()
    assert remat.passes.torch_adapter.OwnSession._running is None and not torch._C._autograd._profiler_enabled()
    assert watch.state is eager_parts.State.MEASURING and out.numel() == 3  # the next step measures
