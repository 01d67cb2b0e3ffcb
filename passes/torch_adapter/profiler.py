"""The CPU profiler's memory events, for a whole step or for a window of one (torch.profiler's
Kineto trace: no public API gives the running total of bytes allocated)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch


def cpu_memory_events(step: Callable[[], Any]) -> list[dict[str, Any]]:
    """The profiler's CPU ``[memory]`` events while ``step()`` runs, in order, each with its
    "Bytes" and running "Total Allocated" (read from the exported Kineto trace: no public API
    gives the running total)."""
    recorder = CpuMemoryRecorder()
    recorder.start()
    try:
        step()
    finally:
        events = recorder.stop()
    return events


class CpuMemoryRecorder:
    """The profiler's CPU ``[memory]`` events between :meth:`start` and :meth:`stop` (which may
    be called from different frames, e.g. a forward's end and a gradient hook: a window of a
    step). :meth:`start` raises ``RuntimeError`` where a profiler is already running."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def start(self) -> None:
        with _quiet_stderr():
            self.prof.start()

    def discard(self) -> None:
        """Stop, reading nothing."""
        with _quiet_stderr():
            self.prof.stop()

    def stop(self) -> list[dict[str, Any]]:
        return [e["args"] for e in self.stop_trace() if is_cpu_memory_event(e)]

    def stop_trace(self) -> list[dict[str, Any]]:
        """Stop; every trace event, each with its "name", "ts" and "args"."""
        import json
        import os
        import tempfile

        self.discard()
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self.prof.export_chrome_trace(path)
            with open(path) as f:
                return json.load(f)["traceEvents"]
        finally:
            os.unlink(path)


def is_cpu_memory_event(event: dict[str, Any]) -> bool:
    return event.get("name") == "[memory]" and event.get("args", {}).get("Device Type", 0) == 0


def profiler_mark(name: str) -> None:
    """A zero-length range named ``name`` in the running profiler's trace (none without one)."""
    with torch.profiler.record_function(name):
        pass


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Close the process's stderr for the block: kineto prints a line on every
    profiler start and stop, from C++, that no setting turns off."""
    import os
    import sys

    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)
