"""Progress bars on a terminal, silence elsewhere.

Profiling and sweeps wrap their loops in :func:`progress`: a tqdm bar on
stderr when stderr is a terminal and tqdm is installed, the plain iterable
otherwise (notebooks, logs, CI). Everything else goes through ``logging``
under the ``"remat"`` logger.

>>> list(progress(range(3), desc="quiet off a terminal"))
[0, 1, 2]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def on_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress(items: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it") -> Iterator[T] | Iterable[T]:
    """``items``, with a transient tqdm bar on a terminal."""
    if not on_terminal():
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, total=total, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True)
