"""Devices a model can be planned for without being there: their throughputs and memory.

A model on the meta device allocates nothing and runs nothing, so every cost is analytic
(FLOPs and bytes over the device's peaks, ``passes/costs/profile.py``) and every size is exact
from shapes. :func:`device_spec` names the devices remat knows; a :class:`DeviceSpec`
describes any other. While :func:`planning_for` is entered, the analytic profile of a
meta graph uses that device's figures.

>>> device_spec("h100-80gb").memory_bytes // 2**30
80
>>> device_spec(DeviceSpec(flops=1e12, bandwidth=1e11, memory_bytes=2**30)).name
'custom'
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass

GIB = 2 ** 30


@dataclass(frozen=True)
class DeviceSpec:
    """One device's peaks: ``flops`` per second at 16-bit precision (dense tensor cores on a GPU),
    ``bandwidth`` in bytes per second, ``memory_bytes`` it holds; ``fp32_flops`` (None: ``flops``)
    for 32-bit ops; ``kind`` "cuda" or "cpu" picks the attention kernels it has."""

    flops: float
    bandwidth: float
    memory_bytes: int
    fp32_flops: float | None = None
    kind: str = "cuda"
    name: str = "custom"

    def __post_init__(self) -> None:
        if self.flops <= 0 or self.bandwidth <= 0 or self.memory_bytes <= 0:
            raise ValueError(f"a DeviceSpec's flops, bandwidth and memory_bytes must be positive, got {self}")
        if self.kind not in ("cuda", "cpu"):
            raise ValueError(f"DeviceSpec kind must be 'cuda' or 'cpu', not {self.kind!r}")

    def flops_for(self, itemsize: int) -> float:
        """Peak FLOP/s for ops on elements of ``itemsize`` bytes."""
        return self.fp32_flops if itemsize >= 4 and self.fp32_flops is not None else self.flops


def _machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # a platform without sysconf
        return 16 * GIB


# Vendors' dense figures (bf16 tensor cores; fp32 as TF32 tensor cores, torch's default for
# matmuls under allow_tf32 is IEEE fp32, so this is optimistic for fp32) and HBM bandwidth.
NAMED: dict[str, DeviceSpec] = {
    "h100-80gb": DeviceSpec(989e12, 3.35e12, 80 * GIB, fp32_flops=67e12, name="h100-80gb"),
    "h200": DeviceSpec(989e12, 4.8e12, 141 * 10 ** 9, fp32_flops=67e12, name="h200"),
    "a100-40gb": DeviceSpec(312e12, 1.555e12, 40 * GIB, fp32_flops=19.5e12, name="a100-40gb"),
    "a100-80gb": DeviceSpec(312e12, 2.039e12, 80 * GIB, fp32_flops=19.5e12, name="a100-80gb"),
    "l4": DeviceSpec(121e12, 0.3e12, 24 * GIB, fp32_flops=30e12, name="l4"),
}


def cpu_spec() -> DeviceSpec:
    """This machine's CPU as ``profile="analytic"`` costs it (the same peaks), with its memory."""
    from .costs.profile import DevicePeaks  # the figures an analytic CPU profile uses

    import torch

    peaks = DevicePeaks.for_device(torch.device("cpu"))
    return DeviceSpec(peaks.flops_per_s, peaks.bytes_per_s, _machine_memory(), kind="cpu", name="cpu")


def names() -> list[str]:
    """The devices :func:`device_spec` knows by name."""
    return [*NAMED, "cpu"]


def device_spec(device: str | DeviceSpec) -> DeviceSpec:
    """The :class:`DeviceSpec` named ``device`` (or ``device`` itself)."""
    if isinstance(device, DeviceSpec):
        return device
    if device == "cpu":
        return cpu_spec()
    if device not in NAMED:
        raise ValueError(f"unknown device {device!r}: name one of {names()}, or pass "
                         f"remat.passes.devices.DeviceSpec(flops, bandwidth, memory_bytes)")
    return NAMED[device]


_PLANNING_FOR: contextvars.ContextVar[DeviceSpec | None] = contextvars.ContextVar("remat_device", default=None)


@contextlib.contextmanager
def planning_for(spec: DeviceSpec) -> Iterator[None]:
    """Meta graphs profiled in the block are costed for ``spec``."""
    token = _PLANNING_FOR.set(spec)
    try:
        yield
    finally:
        _PLANNING_FOR.reset(token)


def planned_for() -> DeviceSpec | None:
    """The device entered by :func:`planning_for`, or None."""
    return _PLANNING_FOR.get()


def planned_device() -> DeviceSpec:
    """The device meta graphs are planned for now: :func:`planned_for`'s, or this machine's CPU."""
    return planned_for() or cpu_spec()


def program_accounted(compiler: str, spec: DeviceSpec | None) -> bool:
    """Whether a plan is judged by the program Inductor generates for it: under Inductor on the real
    device (``spec`` None), or on meta for a device whose program can be generated here for fake
    inputs (nothing run): the CPU, whose code generation is C++. A GPU's Triton code generation reads
    the GPU it compiles for, so a meta plan for one stays the FX-level model's."""
    return compiler == "inductor" and (spec is None or spec.kind == "cpu")
