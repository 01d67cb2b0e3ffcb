"""The peak diff's programs (b), ``torch.compile`` of the checkpointed model, and (c), remat at its
smallest feasible budget: each run for one step with the programs Inductor generates captured, its
peak measured as the budget counts it, its live set read by the replay of ``bench/peak_diff_replay.py``
and checked, size by size, against the CPU profiler's live set at the measured peak (read as
``bench/peak_diff_eager.py`` reads the eager step's).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

import remat
from bench.peak_diff_eager import eager_allocations, live_at_peak, traced_events
from bench.peak_diff_live_set import MIB, LiveSet
from bench.peak_diff_replay import Lowered, compiled_buffers, handed_by_position, short_list
from bench.peers import checkpointed_blocks
from remat.errors import GIB
from remat.measure import budget_peak
from remat.passes.program import inductor_account as account
from remat.passes import torch_adapter as adapter
from remat.passes.torch_adapter import live_set


@contextlib.contextmanager
def lowered_programs() -> Iterator[list[Lowered]]:
    """Every program Inductor generates in the block (caches off, the backward lowered with the
    forward), read as ``inductor_account`` reads it, its buffers' FX nodes beside. remat's own
    reading of the same programs (its compiles nest inside) is left as it would be."""
    found: list[Lowered] = []

    def seen(lowering: Any) -> None:
        with live_set.partitioned_outputs_kept():
            program = account.walk(lowering)
        found.append(Lowered(program, live_set.buffer_origins(lowering), live_set.is_backward(lowering),
                             live_set.buffer_bytes(lowering)))

    with adapter.on_inductor_codegen(seen):
        yield found


def pairs(lowered: list[Lowered]) -> list[tuple[Lowered, Lowered]]:
    """(forward, backward) programs in the order compiled; a forward whose backward was not
    generated (a cache hit) is skipped."""
    out, forward = [], None
    for item in lowered:
        if not item.backward:
            forward = item
        elif forward is not None:
            out.append((forward, item))
            forward = None
    return out


def step_peak(model: nn.Module, run: Callable[..., torch.Tensor], inputs: tuple) -> int:
    """A step's peak as the budget counts it, gradients cleared before and after."""
    model.zero_grad(set_to_none=True)
    peak = budget_peak(lambda: run(*inputs).backward(), model, inputs, "cpu")
    model.zero_grad(set_to_none=True)
    return peak


def profiled_sizes(model: nn.Module, run: Callable[..., torch.Tensor], inputs: tuple) -> Counter[int]:
    """The sizes of the allocations alive at a step's peak, as the CPU profiler saw them (bytes
    allocated before the step and freed before its peak counted negative): the cross-check of a
    compiled program's account, whose buffers the profiler cannot name."""
    model.zero_grad(set_to_none=True)
    events = traced_events(lambda: run(*inputs).backward())
    model.zero_grad(set_to_none=True)
    memory, contexts, _, _ = eager_allocations(events)
    _, alive, before = live_at_peak(memory, contexts)
    return Counter([a.bytes for a in alive] + ([-before] if before else []))


def account_check(live: LiveSet, profiled: Counter[int]) -> None:
    """Note where the account's live set and the profiler's differ, size by size."""
    accounted = Counter(b.bytes for b in live.buffers if b.role != "held")
    only_account, only_profiler = accounted - profiled, profiled - accounted
    if only_account or only_profiler:
        live.notes.append(
            f"the profiler's live set at the measured peak differs from the account's: sizes only in the account "
            f"{sorted(only_account.elements())} B, only in the profiler's {sorted(only_profiler.elements())} B")
    else:
        live.notes.append(f"the profiler's live set at the measured peak has the account's sizes, one for one "
                          f"({sum(profiled.values())} allocations)")


def compiled_live_set(model: nn.Module, inputs: tuple) -> LiveSet:
    """(b): ``torch.compile`` of the checkpointed model; the account of its program, no kernel
    scratch (torch did not profile one)."""
    adapter.reset_compiled()
    with checkpointed_blocks(model):
        compiled = torch.compile(model)
        with lowered_programs() as lowered:
            compiled(*inputs).backward()
        measured = step_peak(model, compiled, inputs)
        profiled = profiled_sizes(model, compiled, inputs)
    adapter.reset_compiled()
    (forward, backward), = pairs(lowered)
    live = compiled_set("b", forward, backward, {}, measured)
    account_check(live, profiled)
    return live


def compiled_set(program: str, forward: Lowered, backward: Lowered, workspace: dict[str, int],
                 measured: int) -> LiveSet:
    peak, buffers, unallocated = compiled_buffers(forward, backward, workspace)
    accounted = account.step_account([forward.program, backward.program], workspace)
    live = LiveSet(program, measured, peak.at, buffers, accounted_bytes=accounted.peak_bytes)
    if not accounted.complete:
        live.notes.append(f"the account is incomplete: {accounted.incomplete_reason}")
    renamed = handed_by_position(forward.program, backward.program)
    if unallocated:
        live.notes.append(f"{len(unallocated)} extern-kernel output(s) that no wrapper line allocates (elements of "
                          f"a nested tuple: {short_list(tuple(unallocated))}) added at their first use, with their "
                          f"layout's bytes; inductor_account leaves them out")
    if renamed:
        live.notes.append(f"{len(renamed)} backward input(s) named otherwise than the forward output they are, "
                          f"matched by position ({short_list(tuple(f'{b} = {f}' for b, f in renamed.items()))}); "
                          f"inductor_account matches by name and counts each twice")
    if renamed or unallocated:
        live.notes.append(f"so inductor_account's own peak for this program is {accounted.peak_bytes} B "
                          f"({accounted.peak_bytes / MIB:.2f} MiB), the live set here {peak.bytes} B")
    elif accounted.peak_bytes != peak.bytes:  # the replay is the account's own walk: a difference is a bug here
        live.notes.append(f"replay peak {peak.bytes} B differs from the account's {accounted.peak_bytes} B")
    return live


def smallest_budget(model: nn.Module, inputs: tuple) -> int:
    """remat's smallest feasible budget, as ``remat.plan`` computes it (the lower compiled peak of
    its smallest-peak and fastest plans: a budget ``remat.compile`` accepts), the figure the
    report names."""
    adapter.reset_compiled()
    try:
        return remat.plan(model, *inputs, plan_cache=False).min_feasible_bytes
    finally:
        adapter.reset_compiled()


def remat_live_set(model: nn.Module, inputs: tuple) -> LiveSet:
    """(c): remat compiled at its smallest feasible budget. Of the programs its fitting loop
    generated, the one it runs is the last whose account (with remat's profiled kernel scratch)
    equals the report's compiled peak."""
    budget = smallest_budget(model, inputs)
    compiled = remat.compile(model, budget_gb=budget / GIB, plan_cache=False)
    with lowered_programs() as lowered:
        compiled(*inputs).backward()
    report = remat.reports(compiled)[0]
    measured = step_peak(model, compiled, inputs)
    profiled = profiled_sizes(model, compiled, inputs)
    adapter.reset_compiled()
    workspace = {row.name: row.workspace for row in report.nodes if row.workspace}
    found = pairs(lowered)
    runs = [p for p in found if account.step_account([p[0].program, p[1].program], workspace).peak_bytes
            == report.compiled_peak_bytes]
    live = compiled_set("c", *(runs or found)[-1], workspace, measured)
    live.notes.append(f"budget {budget} B ({budget / MIB:.2f} MiB), remat's smallest feasible; "
                      f"{len(found)} program(s) compiled at it, report's compiled peak {report.compiled_peak_bytes} B, "
                      f"recomputes {len(report.recomputed)} values")
    if not runs:
        live.notes.append("no program's account equals the report's compiled peak: the last one compiled is shown")
    account_check(live, profiled)
    return live
