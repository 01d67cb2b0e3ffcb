"""The accounts of programs Inductor generated in this process, by graph and decision.

The fitting loop (``passes/program/fit.py``) compiles a plan to learn what its program peaks at. A
notebook plans a model, sweeps its budgets, then compiles it: each step used to compile again
the programs the one before had compiled (the smallest-peak plan's above all, for the smallest
feasible budget). A program follows from the captured graph, its inputs, Inductor's settings and
the plan's saved and recomputed sets, so its account, once read, holds for the process: a plan
whose program is known to miss its target is not compiled again, and a budget below the known
smallest-peak program is refused without compiling. What the step holds around the program (the
scope: the eager head and loss, other graphs) is the plan's own, added to the account each time.

Bounded (the oldest forgotten first).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from remat.solvers.solution import Solution

from ..cache import plan_cache
from .. import torch_adapter as adapter
from ..capture.values import describe_value

CAPACITY = 256  # programs remembered; a fitting loop compiles at most six per graph


@dataclass(frozen=True)
class ProgramAccount:
    """What a program's account says, apart from the step around it (``inductor_account.StepAccount``)."""

    peak_bytes: int | None  # None: not read (a plan loaded from the plan cache keeps only its hand-off)
    handoff_bytes: int  # alive when its forward returns: its inputs and what it hands the backward
    peaks: tuple[int, int, int] | None  # its forward's and backward's peaks, the caller's outputs (None: unread)


def identity(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """What a graph's program follows from besides its plan, known before tracing: the graph,
    its inputs' shapes and grad flags, grad mode, autocast and Inductor's settings."""
    autocast = [(d, repr(torch.get_autocast_dtype(d))) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    key = {"program": plan_cache.graph_fingerprint(gm.graph), "inputs": describe_value(list(example_inputs)),
           "requires_grad": [getattr(x, "requires_grad", None) for x in example_inputs],
           "grad": torch.is_grad_enabled(), "autocast": autocast}
    return json.dumps(key, sort_keys=True) + adapter.inductor_config_digest().hex()


class KnownPrograms:
    """Compiled programs' accounts, for the process (``KNOWN``); each keyed by its graph's
    ``identity``, the plan's decision and the scratch the profile measured per op."""

    def __init__(self) -> None:
        self._accounts: OrderedDict[tuple, ProgramAccount] = OrderedDict()

    @staticmethod
    def key(graph: str, solution: Solution, workspace: dict[str, int]) -> tuple:
        return graph, solution.saved, solution.recomputed, tuple(sorted(workspace.items()))

    def account(self, graph: str, solution: Solution, workspace: dict[str, int]) -> ProgramAccount | None:
        return self._accounts.get(self.key(graph, solution, workspace))

    def remember(self, graph: str, solution: Solution, workspace: dict[str, int], account: ProgramAccount) -> None:
        key = self.key(graph, solution, workspace)
        self._accounts[key] = account
        self._accounts.move_to_end(key)
        while len(self._accounts) > CAPACITY:
            self._accounts.popitem(last=False)

    def forget(self) -> None:
        self._accounts.clear()


KNOWN = KnownPrograms()
