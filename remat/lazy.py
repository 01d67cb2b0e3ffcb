"""Figures computed only when someone reads them.

Some figures a Report carries cost a solve or a compile that the plan itself
does not need (the smallest feasible budget, torch's min-cut plan scored by
remat's model). Issue 12: work nobody asked for is not done. So such a field
is a :class:`Deferred` one: :meth:`Deferring.defer` registers how to compute it,
and the first read computes it (with any fields computed alongside) and keeps
the value. Setting the field drops whatever was pending for it.

>>> from dataclasses import dataclass
>>> @dataclass
... class Figures(Deferring):
...     cheap: int
...     costly: int = Deferred(0)
>>> f = Figures(1)
>>> f.defer(lambda: print("computing") or {"costly": 42}, "costly")
>>> f.pending
['costly']
>>> f.costly
computing
42
>>> f.costly, f.pending
(42, [])

Rendering never computes: :meth:`Deferring.peek` reads a field only if it is known.

>>> g = Figures(1)
>>> g.defer(lambda: print("computing") or {"costly": 42}, "costly")
>>> g.peek("costly"), g.peek("cheap"), g.pending
(None, 1, ['costly'])
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from remat.solvers.plan import Once  # noqa: F401  (re-exported: the policy's memo)

_MISSING = object()


class Deferred:
    """A dataclass field whose value may be computed on first read (see :class:`Deferring`)."""

    def __init__(self, default: Any = _MISSING) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:  # the dataclass asks for the default; none makes the field required
            if self.default is _MISSING:
                raise AttributeError(self.name)
            return self.default
        if self.name in obj.__dict__.get("_pending", {}):
            obj._fill(self.name)
        return obj.__dict__[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__.get("_pending", {}).pop(self.name, None)
        obj.__dict__[self.name] = value


class Deferring:
    """Mixin for a dataclass with :class:`Deferred` fields."""

    def defer(self, compute: Callable[[], dict[str, Any]], *names: str) -> None:
        """Compute ``names`` when any of them is first read: ``compute()`` returns their values.
        Until then they hold what was set last (their placeholders). A field set or deferred
        again later keeps that later value or computation."""
        pending = self.__dict__.setdefault("_pending", {})
        group = (compute, names)  # one object per call: a later defer or set of a name replaces it
        for name in names:
            pending[name] = group

    def _fill(self, name: str) -> None:
        """Compute the group ``name`` was deferred with, and set those of its fields still waiting
        for it (directly: a read-only object's fields are filled so too)."""
        pending = self.__dict__["_pending"]
        group = pending[name]
        compute, names = group
        values = compute()  # if it raises, the fields stay pending and the next read tries again
        for other in names:
            if pending.get(other) is group:
                del pending[other]
                self.__dict__[other] = values[other]

    def _copy(self) -> Any:
        """A shallow copy whose pending fields are its own (computed for it alone when read)."""
        new = copy.copy(self)  # its own __dict__, sharing the values
        new.__dict__["_pending"] = dict(self.__dict__.get("_pending", {}))
        return new

    def peek(self, name: str, default: Any = None) -> Any:
        """Field ``name`` as known now, or ``default`` while it is pending: computes nothing
        (what a summary or a card reads, so that rendering never solves or compiles)."""
        if name in self.__dict__.get("_pending", {}):
            return default
        return getattr(self, name)

    @property
    def pending(self) -> list[str]:
        """The deferred fields not computed yet."""
        return sorted(self.__dict__.get("_pending", {}))

