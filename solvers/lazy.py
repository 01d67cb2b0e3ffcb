"""Figures computed only when someone reads them: remat's one mechanism for them.

Some figures cost a solve or a compile that the plan itself does not need (the smallest feasible
budget, torch's min-cut plan scored by remat's model, the peers' rules). Work nobody asked for is not
done. :class:`Once` is a computation run on its first call and remembered (the smallest-peak plan is
one); a :class:`Deferred` field of a :class:`Deferring` dataclass is computed by such a computation
on its first read, together with the fields computed alongside, and keeps the value. The passes'
``GraphPlan``, remat's ``Report`` and ``Frontier`` are such records: a report defers its figures to
its plan's (:meth:`Deferring.defer_from`), so whichever is read first computes them, once for both.

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
>>> h = Figures(2)
>>> h.defer_from(g)
>>> h.costly, g.pending
computing
(42, [])
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_MISSING = object()


class Once(Generic[T]):
    """``fn()`` run on the first call and remembered; ``done`` says whether it ran (if it raises,
    nothing is remembered and the next call runs it again)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = False
        self.value: T | None = None

    def __call__(self) -> T:
        if not self.done:
            self.value, self.done = self.fn(), True
        return self.value  # type: ignore[return-value]


Group = tuple[Once[dict[str, Any]], tuple[str, ...]]


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
    """Mixin for a dataclass with :class:`Deferred` fields. The fields are filled in where they are
    read (directly in the object's ``__dict__``, so a frozen dataclass is filled so too): what a
    field means never changes, only whether it is computed yet."""

    def defer(self, compute: Callable[[], dict[str, Any]], *names: str) -> None:
        """Compute ``names`` when any of them is first read: ``compute()`` returns their values.
        Until then they hold what was set last (their placeholders). A field set or deferred
        again later keeps that later value or computation. Meant for a record being made: once
        others read it, make a copy (a frozen record's ``revised``) and defer on that."""
        pending = self.__dict__.setdefault("_pending", {})
        group: Group = (compute if isinstance(compute, Once) else Once(compute), names)
        for name in names:  # one group per call: a later defer or set of a name replaces it
            pending[name] = group

    def defer_from(self, source: Deferring, names: Collection[str] | None = None) -> None:
        """Each field pending on ``source`` (of ``names``, if given), read from ``source`` when first
        read here: computed there, once for both."""
        for group in source._groups(names):
            self.defer(lambda group=group: {name: getattr(source, name) for name in group}, *group)

    def _groups(self, names: Collection[str] | None = None) -> list[tuple[str, ...]]:
        """The pending fields, by the group that computes them (of ``names``, if given)."""
        by_group: dict[int, list[str]] = {}
        for name, group in self.__dict__.get("_pending", {}).items():
            if names is None or name in names:
                by_group.setdefault(id(group), []).append(name)
        return [tuple(group) for group in by_group.values()]

    def _fill(self, name: str) -> None:
        """Compute the group ``name`` was deferred with, and set those of its fields still waiting
        for it."""
        pending = self.__dict__["_pending"]
        group = pending[name]
        compute, names = group
        values = compute()  # if it raises, the fields stay pending and the next read tries again
        for other in names:
            if pending.get(other) is group:
                del pending[other]
                self.__dict__[other] = values[other]

    def _copy(self) -> Any:
        """A shallow copy whose pending fields are its own (a field computed for one is read by the
        other from the same computation, which runs once)."""
        new = copy.copy(self)  # its own __dict__, sharing the values
        new.__dict__["_pending"] = dict(self.__dict__.get("_pending", {}))
        return new

    def peek(self, name: str, default: Any = None) -> Any:
        """Field ``name`` as known now, or ``default`` while it is pending: computes nothing
        (what a summary or a card reads, so that rendering never solves or compiles)."""
        if name in self.__dict__.get("_pending", {}):
            return default
        return getattr(self, name)

    def known(self, names: Collection[str]) -> dict[str, Any]:
        """Those of ``names`` computed or set already, by name: computes nothing."""
        pending = self.__dict__.get("_pending", {})
        return {name: getattr(self, name) for name in names if name not in pending}

    @classmethod
    def deferred_fields(cls) -> tuple[str, ...]:
        """The names of the class's :class:`Deferred` fields."""
        return tuple(name for klass in reversed(cls.__mro__) for name, value in vars(klass).items()
                     if isinstance(value, Deferred))

    @property
    def pending(self) -> list[str]:
        """The deferred fields not computed yet."""
        return sorted(self.__dict__.get("_pending", {}))
