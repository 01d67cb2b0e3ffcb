"""A value as plain data: what an op's cost, a plan and a compiled program are keyed on.

One describer for the three keys (``passes/costs/profile.py``'s op cost key, ``passes/cache/plan_cache.py``'s
graph and input key, and ``passes/program/known_programs.py``'s program identity), so that what makes two
values the same is decided once.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import torch_adapter as adapter

NUMBERS = (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)


def hint(size: int | torch.SymInt) -> int:
    """A symbolic size's example value, read without adding a guard."""
    return int(adapter.size_hint(size))


def describe_value(val: Any) -> Any:
    """``val`` as plain data: a tensor's sizes, strides, dtype and device type, a number's value,
    anything else's type name. A symbolic size is its example value, the size a value is costed,
    planned and compiled at (by name, ``s0`` would stand for every size a dynamic graph is captured
    at). The device by its type: a rank on ``cuda:3`` plans and costs as one on ``cuda:0``.

    >>> describe_value([torch.zeros(2, 3), 4, None, "x"])
    (('T', (2, 3), (3, 1), 'torch.float32', 'cpu'), ('N', '4'), None, 'str')
    """
    if isinstance(val, torch.Tensor):
        return ("T", tuple(hint(s) for s in val.shape), tuple(hint(s) for s in val.stride()), str(val.dtype),
                val.device.type)
    if isinstance(val, (list, tuple)):
        return tuple(describe_value(v) for v in val)
    if isinstance(val, NUMBERS):
        return ("N", str(adapter.size_hint(val)))
    return None if val is None else type(val).__name__
