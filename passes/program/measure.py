"""Measure a step's peak as the budget contract counts it.

    peak bytes allocated during the step - bytes allocated just before it
    + bytes of the graph's inputs

From the ``[memory]`` events of a profiler session of remat's own, whose
running "Total Allocated" covers Inductor's buffers too (the allocator's peak
statistics are never reset): the measured peak, one of the four ``passes/peaks.py`` names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import torch_adapter as adapter


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def held_bytes(model: Any, inputs: Iterable[Any]) -> int:
    """What the budget counts as held through the step: the model's parameters and buffers
    (when it is a module) and the step's inputs, each storage once."""
    held = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else []
    return tensor_bytes([*held, *inputs])


def budget_peak(step: Callable[[], Any], model: Any, inputs: Iterable[Any], device: torch.device | str) -> int:
    """A step's peak as the budget counts it: the peak allocated while ``step()`` runs above
    what was allocated before, plus ``held_bytes(model, inputs)``."""
    return step_peak(step, device) + held_bytes(model, inputs)


def step_peak(step: Callable[[], Any], device: torch.device | str) -> int:
    """Peak bytes allocated on ``device`` while ``step()`` runs, above what was allocated before.

    Read from the ``[memory]`` events of a profiler session of remat's own (CPU and CUDA alike),
    never from the allocator's peak statistics, which it leaves as they were (a caller reading
    ``torch.cuda.max_memory_allocated`` around the step reads what it would without remat). While
    a profiler of the caller's runs, remat starts none beside it: ``ProfilerBusy`` says so."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)

    def synchronized() -> None:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    events = adapter.own_memory_events(synchronized)
    return peak_of_events([e for e in events if adapter.on_device(e, device)])


def cuda_step_peak(step: Callable[[], Any], device: torch.device | str = "cuda") -> int:
    return step_peak(step, device)


def cpu_step_peak(step: Callable[[], Any]) -> int:
    return step_peak(step, "cpu")


def peak_of_events(memory: list[dict[str, Any]]) -> int:
    """Peak bytes allocated above the start of a profiling session, from its ``[memory]`` events
    of one device."""
    if not memory:
        return 0
    # "Total Allocated" counts from where an earlier profiling session left
    # off; the first event tells where this one started.
    start = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(0, max(m["Total Allocated"] for m in memory) - start)
