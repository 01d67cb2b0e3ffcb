"""The PuLP model of FORMULATION.md as data: its variables by value name, and its units.

:func:`.ilp.add_variables` makes a :class:`Model`; the constraint and objective rows
(``ilp_rows.py``) are added to it; the warm start (``warm_start.py``) and the relaxation
(``rounding.py``) read its variables. Its own module so that each of them can import it
without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pulp

from .blocks import Fixed, Ties
from .model import Starts
from .problem import Value

Objective = Literal["time", "peak"]


@dataclass(frozen=True)
class Scales:
    """Units that keep the PuLP numbers well conditioned (FORMULATION.md)."""

    seconds: float  # tau: one objective unit of time, TIE_BREAK of the cheapest decision
    bytes: float  # one memory unit
    peak_cap: int  # an upper bound on the peak: every decision on


@dataclass
class Model:
    """The PuLP problem and its variables, keyed by value name."""

    prob: pulp.LpProblem
    candidates: tuple[Value, ...]  # PuLP index i -> value
    S: dict[str, pulp.LpVariable]
    R: dict[str, pulp.LpVariable]
    L: dict[str, list[pulp.LpVariable]]  # per segment of starts[name]: alive there, before the read
    starts: dict[str, Starts]
    M: list[pulp.LpVariable]
    P: pulp.LpVariable
    scales: Scales
    objective: Objective = "time"
    ties: Ties = field(default_factory=dict)  # a copy's value -> its representative's (shared variables)
    fixed: Fixed = field(default_factory=dict)  # decisions taken before the solve (near.py)
    rows: set[tuple] = field(default_factory=set)  # started and operand rows already added (tied copies repeat them)
