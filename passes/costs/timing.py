"""Timing: how the profiler measures one op run alone.

Its time (the fastest of several runs, on the CPU on one thread, rounded to a grid so that
two processes measure the same figure), its FLOPs, the scratch bytes it allocates beyond its
outputs, and the random state it runs under (seeded, the caller's left as it was).
:mod:`.profile` calls these for every op it measures.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from .. import torch_adapter as adapter

# Decisions must not follow timing noise: two processes (or two ranks) that time an op
# differently would choose different plans. The fastest of several runs is what the op
# costs with no interference (a slower sample measures a stalled thread, not the op), and
# a time on a grid of QUANTUM steps is the same in every process unless it sits on a step.
# On the CPU ops are timed on one thread: with several, a parallel op waits for its slowest
# thread, and on a loaded machine every run of it can wait out another process's time slice
# (a 25 us op measured at 8 ms in every sample). One thread's times rank ops the same way.
MIN_SAMPLES, MAX_SAMPLES = 5, 50
SAMPLE_SECONDS = 2e-3  # keep sampling a fast op until this much time was measured
QUANTUM = 2 ** 0.25  # a grid step: 19 %, coarser than run-to-run spread of the fastest run


def quantize_seconds(seconds: float) -> float:
    """``seconds`` on a geometric grid of ``QUANTUM`` steps (0 stays 0).

    >>> quantize_seconds(1.0), quantize_seconds(1.05) == quantize_seconds(0.97)
    (1.0, True)
    """
    if seconds <= 0:
        return 0.0
    steps = round(math.log(seconds, QUANTUM))
    return QUANTUM ** steps


def time_call(fn: Callable[[], Any], device: torch.device, repeats: int = MIN_SAMPLES) -> float:
    """Seconds of ``fn``'s fastest run after one warm-up (CUDA events on GPU; one thread on
    the CPU), on the grid."""
    with one_thread() if device.type == "cpu" else contextlib.nullcontext():
        return quantize_seconds(min(samples_of(fn, device, repeats)))


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def samples_of(fn: Callable[[], Any], device: torch.device, repeats: int) -> list[float]:
    fn()
    samples: list[float] = []
    while len(samples) < max(repeats, 1) or (sum(samples) < SAMPLE_SECONDS and len(samples) < MAX_SAMPLES):
        samples.append(seconds_of_call(fn, device))
    return samples


def seconds_of_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn``: CUDA events on GPU (the kernels' time), wall clock elsewhere."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3


def count_flops(fn: Callable[[], Any]) -> float:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return float(counter.get_total_flops())


def measure_workspace(fn: Callable[[], Any], device: torch.device, out_bytes: int) -> int:
    """Scratch bytes an op allocates beyond its outputs, at its peak (call it on the measuring
    thread: :func:`profile_graph` runs there)."""
    # the smaller of two runs: a first call may allocate caches it keeps
    peak = min(adapter.thread_memory_peak(fn, device), adapter.thread_memory_peak(fn, device))
    return max(0, peak - out_bytes)


@contextlib.contextmanager
def caller_rng_kept(device: torch.device) -> Iterator[None]:
    """Random inputs (and random ops measured alone) draw from a stream seeded here, and the
    caller's random state is as it was afterwards: a step's random numbers after remat's first
    step are eager's, and two processes measure ops on the same inputs."""
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(0)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(0)
        yield
