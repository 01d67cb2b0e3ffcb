"""Memory measurements that never touch a profiler of the caller's.

torch's Kineto profiler is one per process. A session started while the caller's runs (or while
the caller's scheduled profiler is in its warm-up) takes it over: stopping it stops the caller's
("disableProfiler called but no active profiling session found") and the caller's
``export_chrome_trace`` then crashes the process. So remat measures memory in three ways, none of
which starts, stops or nests a profiler inside a session of the caller's:

- ops remat runs itself (the profile pass: each op alone on random inputs) run on remat's own
  thread, :class:`MeasuringThread`, under torch's *thread-local* (legacy) profiler: it records
  only the thread that enabled it, so a caller's session never sees remat's ops, and remat's
  figures are the same whether the caller profiles or not;
- a step of the caller's that remat is asked to measure (``remat.measure``, bench/) runs under a
  session of remat's own (:class:`OwnSession`), only when :func:`caller_is_profiling` finds none of
  the caller's; otherwise :class:`ProfilerBusy` says so;
- a window of the caller's own step (the eager head and loss, ``passes/scope/eager_parts.py``) is
  measured in a session of remat's own only when no profiler of the caller's runs as it opens (else
  the measurement waits for a step without one), and that session ends as the backward returns
  (:func:`when_backward_returns`), before the caller's code runs again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gc
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class ProfilerBusy(RuntimeError):
    """A profiler of the caller's is running: remat will not start one of its own beside it."""


def caller_is_profiling() -> bool:
    """Whether a torch profiler session is running or prepared in this process: enabled (its
    recording steps, the legacy profiler, ``emit_nvtx``), or prepared by a scheduled
    ``torch.profiler.profile`` in its warm-up steps, which no flag of torch's shows."""
    from torch.autograd import profiler as autograd_profiler

    if torch._C._autograd._profiler_enabled() or autograd_profiler._is_profiler_enabled:
        return True
    session = autograd_profiler.profile
    # type(), not isinstance(): isinstance reads __class__, which some deprecated objects warn on
    return any(_prepared(obj) for obj in gc.get_objects() if issubclass(type(obj), session))


def _prepared(session: Any) -> bool:
    """An autograd profiler session prepared (``entered``) whose results were not yet taken."""
    return bool(getattr(session, "entered", False)) and getattr(session, "kineto_results", None) is None


class OwnSession:
    """A Kineto session of remat's own recording memory events: :meth:`start` refuses (``ProfilerBusy``)
    while a profiler of the caller's runs or is prepared; :meth:`stop` ends it, and :attr:`events` then
    holds every trace event, each with its "name", "ts" and "args" (the exported trace: no public API
    gives the running total of bytes allocated).

    A session started while another of remat's own runs (a step measured by ``remat.measure`` whose
    eager window remat measures too) rides on it: one Kineto session, and the rider's :attr:`events`
    are the outer session's, filled when the outer one stops.

    Stop a session on the thread that started it, never inside a backward: autograd restores the
    thread's profiler state when each of its nodes ends, so a session stopped there comes back enabled
    and the caller's next profiler is refused (:func:`when_backward_returns`)."""

    _running: OwnSession | None = None  # the outer session of remat's own, while one runs

    def __init__(self) -> None:
        self._session: Any = None
        self._riders: list[OwnSession] = []
        self.events: list[dict[str, Any]] | None = None

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        outer = OwnSession._running
        if outer is not None and not torch._C._autograd._profiler_enabled():
            outer = OwnSession._running = None  # (one its owner dropped unstopped: no profiler runs)
        if outer is not None:
            outer._riders.append(self)
            return
        if caller_is_profiling():
            raise ProfilerBusy("remat measures memory with torch's profiler, and one is already running in this "
                               "process: measure outside your profiler's session")
        self._session = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():
            self._session.start()
        OwnSession._running = self

    def stop(self) -> None:
        """End the session (a rider: nothing to end; its events come with the outer session's)."""
        session, self._session = self._session, None
        if session is None:
            return
        OwnSession._running = None
        with _quiet_stderr():
            session.stop()
        self.events = _trace_events(session)
        for rider in self._riders:
            rider.events = self.events
        self._riders = []


def own_memory_events(step: Callable[[], Any]) -> list[dict[str, Any]]:
    """The ``[memory]`` events' args of every device while ``step()`` runs on this thread, in order, each
    with its "Bytes", running "Total Allocated" and "Device Type" (:class:`OwnSession`)."""
    session = OwnSession()
    session.start()
    try:
        step()
    finally:
        session.stop()
    return [e["args"] for e in session.events or [] if e.get("name") == "[memory]"]


def when_backward_returns(then: Callable[[], None]) -> bool:
    """From inside a backward (a gradient hook on the thread that called it), call ``then`` as soon as
    that backward returns, before the caller's next line runs: a profile function of this thread's
    (``sys.setprofile``) waits for the return of torch's backward entry point, then removes itself.
    False, calling nothing, where no such frame is on this thread's stack or the thread has a profile
    function of someone else's (a Python profiler of the caller's: remat does not displace it)."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_engine_run_backward":
        frame = frame.f_back
    waiting = sys.getprofile()
    if isinstance(waiting, _AfterBackward) and waiting.engine is frame:
        waiting.then.append(then)
        return True
    if frame is None or waiting is not None:
        return False
    sys.setprofile(_AfterBackward(frame, [then]))
    return True


@dataclasses.dataclass
class _AfterBackward:
    """A profile function that calls ``then`` when the ``engine`` frame returns, and removes itself."""

    engine: Any
    then: list[Callable[[], None]]

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        import sys

        if event == "return" and frame is self.engine:
            sys.setprofile(None)
            for then in self.then:
                then()


def _trace_events(session: Any) -> list[dict[str, Any]]:
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        session.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]
    finally:
        os.unlink(path)


def on_device(event: dict[str, Any], device: torch.device) -> bool:
    """Whether a ``[memory]`` event's args are of ``device`` (Kineto numbers the CPU 0 and CUDA 1)."""
    kind = event.get("Device Type", 0)
    if device.type == "cpu":
        return kind == 0
    return kind == 1 and event.get("Device Id", 0) == (device.index or 0)


class MeasuringThread:
    """remat's own thread for running ops it measures: :meth:`run` calls a function there and returns
    its result (or raises its exception). The thread starts with torch's thread-local state fresh (no
    fake-tensor or other dispatch mode of the compile, no autocast, no profiler of the caller's),
    with grad disabled and ``device`` current.

    >>> with MeasuringThread(torch.device("cpu")) as thread:
    ...     thread.run(torch.is_grad_enabled)
    False
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __enter__(self) -> MeasuringThread:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="remat-measure",
                                                           initializer=self._prepare)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._pool is not None
        self._pool.shutdown(wait=True)
        self._pool = None

    def _prepare(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def run(self, fn: Callable[[], T]) -> T:
        assert self._pool is not None, "use MeasuringThread as a context manager"
        return self._pool.submit(fn).result()


def thread_memory_peak(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes allocated on ``device`` while ``fn()`` runs, above what was allocated before it,
    by this thread's own profiler (call it on a :class:`MeasuringThread`: the profiler is enabled
    for this thread only, and no session of the caller's sees it)."""
    from torch.autograd import ProfilerConfig, ProfilerState, _disable_profiler_legacy, _enable_profiler_legacy

    config = ProfilerConfig(ProfilerState.CPU, False, True, False, False, False,
                            torch._C._profiler._ExperimentalConfig())
    _enable_profiler_legacy(config)
    try:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        records = _disable_profiler_legacy()
    running = peak = 0
    for event in (e for thread in records for e in thread if e.kind() == "memory_alloc"):
        if device.type == "cpu":
            running += event.cpu_memory_usage()
        elif event.device() == (device.index or 0):
            running += event.cuda_memory_usage()
        peak = max(peak, running)
    return peak


def profiler_mark(name: str) -> None:
    """A zero-length range named ``name`` in the running profiler's trace (none without one)."""
    with torch.profiler.record_function(name):
        pass


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Close the process's stderr for the block: kineto prints a line on every
    profiler start and stop, from C++, that no setting turns off."""
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
