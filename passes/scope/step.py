"""The training step of this process, as the budget counts it: its open graphs and its measured eager code.

A step runs graphs one after another (a graph break, an encoder and its head compiled apart, blocks
compiled one by one) with eager code between them (a loss outside the model). Two things about it
outlive one graph's compile, and :class:`Step` holds both:

- the **open graphs**: those whose forward has returned and whose backward has not begun. A graph
  compiled while they are open runs beside them, so its scope counts what they hold
  (:meth:`Step.held_beside`). Each graph's watch (``passes/scope/eager_parts.py``) opens and closes its own
  entry on the first step;
- the **eager windows measured** after each graph, by the graph's fingerprint: a graph compiled again
  in this process (another ``remat.compile`` or ``remat.plan`` of the model) counts what an earlier
  step measured after it (:meth:`Step.eager_after`).

``STEP`` is the process's step; ``passes/scope/rank_scope.py`` reads it to build a graph's scope.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .eager_window import EagerParts


@dataclass(frozen=True)
class OpenGraph:
    """What a graph holds while its forward has returned and its backward has not begun. By storage:
    the model state it counts, its outputs (which a later graph may take as inputs) and its activation
    inputs (a batch the caller holds through the step)."""

    held: int  # the activations it keeps, besides its inputs
    state: dict[tuple, int]
    outputs: dict[tuple, int]
    inputs: dict[tuple, int]


class Step:
    """The open graphs of this process's step (by their watch) and the eager windows measured after
    its graphs (by fingerprint)."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[Any, OpenGraph]] = {}  # id(watch) -> (watch, what its graph holds)
        self._measured: dict[str, EagerParts] = {}

    def open(self, watch: Any, graph: OpenGraph) -> None:
        """``watch``'s graph returned from its forward holding ``graph``."""
        self._open[id(watch)] = (watch, graph)

    def close(self, watch: Any) -> None:
        """``watch``'s graph began its backward (or will see none)."""
        self._open.pop(id(watch), None)

    def open_watches(self) -> list[Any]:
        return [watch for watch, _ in self._open.values()]

    def held_beside(self, taken: set[tuple], own_state: dict[tuple, int]) -> int:
        """What the open graphs hold beside a graph compiled now, which takes the storages ``taken`` as
        inputs and counts ``own_state`` as its model's state: their activations (less their outputs it
        takes: it counts those), the batch inputs they took that it does not, and their parameters and
        buffers it does not hold itself."""
        state: dict[tuple, int] = {}
        inputs: dict[tuple, int] = {}
        outputs: set[tuple] = set()
        total = 0
        for _, graph in self._open.values():
            state.update(graph.state)
            inputs.update(graph.inputs)
            outputs.update(graph.outputs)
            total += max(0, graph.held - sum(n for key, n in graph.outputs.items() if key in taken))
        # an open graph's input that no open graph returned and this one does not take: a batch held by
        # the caller (the first graph's token ids while the last runs), counted by no graph's program
        counted = taken | outputs | state.keys() | own_state.keys()
        held_inputs = sum(n for key, n in inputs.items() if key not in counted)
        return total + held_inputs + sum(n for key, n in state.items() if key not in own_state)

    def eager_after(self, fingerprint: str) -> EagerParts | None:
        """The eager window measured after the graph ``fingerprint`` on an earlier step, if any."""
        return self._measured.get(fingerprint)

    def remember(self, fingerprint: str, measured: EagerParts) -> None:
        """A window measured after the graph ``fingerprint``: the largest of each figure measured after
        it (the window is the caller's code, which may differ from step to step), the least freed."""
        known = self._measured.get(fingerprint)
        if known is not None:
            larger = EagerParts(*(max(a, b) if a is not None and b is not None else (a if b is None else b)
                                  for a, b in zip(dataclasses.astuple(measured), dataclasses.astuple(known))))
            measured = dataclasses.replace(larger, freed=min(measured.freed, known.freed))
        self._measured[fingerprint] = measured

    def forget_measured(self) -> None:
        """Forget every measured window (a test measures its own)."""
        self._measured.clear()


STEP = Step()  # the process's step
