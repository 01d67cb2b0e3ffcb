"""Plain data crossing from the FX passes into the solvers: no torch here.

A :class:`Problem` is the joint forward+backward graph flattened into *steps*
(forward nodes in graph order, then backward nodes in graph order) and
*values* (one per node that produces tensors), keyed by node name. Every
value's lifetime is an interval whose ends depend only on its own keep /
recompute decision, so peak memory is linear in the decisions
(see FORMULATION.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import Enum


class Kind(str, Enum):
    """Where a value comes from; decides which lifetime rule applies."""

    INPUT = "input"  # parameters, buffers, batch, tangents: alive throughout
    FORWARD = "forward"  # produced by the forward; a keep/recompute candidate
    BACKWARD = "backward"  # produced by the backward; fixed interval


@dataclass(frozen=True)
class Value:
    """One node's output storage and the facts the solvers need about it.

    Steps are indices into the fixed order ``0 .. problem.num_steps - 1``.

    - ``bytes``: storage bytes this node allocates. Views and other aliases
      own no storage (0); their uses are folded into their base's intervals.
    - ``produced``: step of the node that creates the value.
    - ``last_use``: for INPUT, unused (alive throughout); for BACKWARD, last
      step that reads it (``num_steps - 1`` for produced gradients); for
      FORWARD, last *forward* step that reads it or any alias of it
      (``produced`` when none; ``num_steps - 1`` for forward outputs, which
      the caller holds through the backward).
    - ``need_start`` / ``need_end``: FORWARD only, ``None`` when the backward
      can never need this value. ``need_start`` is the earliest backward
      step that may need it, directly or through any chain of recomputed
      forward users; ``need_end`` the last such step. A kept value lives
      ``[produced, max(last_use, need_end)]``; a recomputed one lives
      ``[produced, last_use]`` and again ``[start, need_end]``, where
      ``start`` is where the plan first needs it (``model.exact_starts``):
      its first direct read, or the start of a recomputed user, whichever
      comes first; never before ``need_start``.
    - ``direct_need``: some backward node reads it (or an alias): it must be
      kept or recomputed.
    - ``direct_start``: where a recomputation for the first backward step that reads it (or
      an alias) counts: that step, or one before it, where the recomputed chain runs before
      the reader's outputs exist (the FX builder's choice); ``None`` when none reads it (then,
      for a ``direct_need`` value, ``need_start``). ``need_start`` and ``need_end`` count a
      user's recomputation at the same step.
    - ``operands``: FORWARD operands that are not INPUTs; recomputing this
      value needs each of them kept or recomputed.
    - ``keep_operands``: operands that must be *kept* (not recomputed) when
      this value is recomputed; an extra rule a builder may impose (the FX
      builder imposes none: recompute starts are exact).
    - ``category``: what kind of op made it (matmul, attention, pointwise, view, random,
      ...; the FX passes' one classification, ``remat.passes.capture.taxonomy``), for reports.
    - ``block``: FORWARD only, the repeated block of the model that computed it (the module
      path up to its index in a list of layers, e.g. ``"blocks.3"``); "" outside any block.
      Checkpoint-per-block in the model (``baselines.checkpoint_blocks``) reads it.
    - ``recompute_ban``: why it may not be recomputed (random op, collective,
      mutation, ...), ``None`` when it may.
    - ``savable``: whether it may be kept (views are never kept: their base is).
    - ``fused_in_forward``: Inductor computes this value inside its forward
      consumers' kernel: it holds memory only when kept (then from
      ``produced`` on) or recomputed.
    - ``recompute_bytes``: bytes held while recomputed (``None``: ``bytes``;
      0 when Inductor fuses the recomputation into its consumers).
    - ``recompute_seconds``: added time if recomputed (near zero for pointwise
      ops that Inductor fuses into their consumer).
    - ``save_seconds``: added time if kept (writing it in the forward and
      reading it in the backward when Inductor would otherwise never
      materialize it; 0 for values materialized anyway).
    """

    name: str
    kind: Kind
    bytes: int
    produced: int
    last_use: int
    op: str = ""
    need_start: int | None = None
    need_end: int | None = None
    direct_need: bool = False
    direct_start: int | None = None
    operands: tuple[str, ...] = ()
    keep_operands: tuple[str, ...] = ()
    recompute_ban: str | None = None
    savable: bool = True
    seconds: float = 0.0
    flops: float = 0.0
    recompute_seconds: float = 0.0
    recompute_bytes: int | None = None
    fused_in_forward: bool = False
    save_seconds: float = 0.0
    category: str = ""
    block: str = ""

    @property
    def fixed_bytes(self) -> int:
        """Bytes over the plan-independent interval."""
        return 0 if self.fused_in_forward else self.bytes

    @property
    def held_when_recomputed(self) -> int:
        return self.bytes if self.recompute_bytes is None else self.recompute_bytes

    @property
    def is_candidate(self) -> bool:
        """A forward value the backward may need: it gets decisions S and R."""
        return self.kind is Kind.FORWARD and self.need_start is not None


Part = tuple[str, int]  # (what it is, bytes): memory the caller names


@dataclass(frozen=True)
class Problem:
    """A whole joint graph, ready for any solver.

    ``values`` are in production order. ``workspace[t]`` is the scratch
    memory of the op at step ``t``. ``step_names[t]`` names the node there.

    The graph may be one part of what its caller holds (the passes fill these; the solvers add
    them to every plan alike and never ask what they are):

    - ``outside``: memory alive at every step that no value of the graph owns, as (what it
      is, bytes) parts named by the caller;
    - ``kept_copies``: how many other copies of this graph (identical blocks that share its
      plan) hold their kept values through its whole step: each kept value's bytes count that
      many more times at every step;
    - ``handoff``: memory the caller allocates between the forward's last step and the
      backward's first, as (what it is, bytes) parts, added at the forward's last step, where
      the graph holds what it hands the backward.
    """

    values: tuple[Value, ...]
    num_forward_steps: int
    num_steps: int
    workspace: tuple[int, ...] = ()
    step_names: tuple[str, ...] = ()
    outside: tuple[Part, ...] = ()
    kept_copies: int = 0
    handoff: tuple[Part, ...] = ()
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        names = [v.name for v in self.values]
        if len(set(names)) != len(names):
            raise ValueError("Problem: value names must be unique")
        if self.workspace and len(self.workspace) != self.num_steps:
            raise ValueError("Problem: workspace needs one entry per step")
        if self.kept_copies < 0 or any(b < 0 for _, b in (*self.outside, *self.handoff)):
            raise ValueError("Problem: outside and handoff bytes and kept_copies cannot be negative")

    @property
    def outside_bytes(self) -> int:
        """Memory alive at every step that no value of the graph owns."""
        return sum(b for _, b in self.outside)

    @property
    def handoff_bytes(self) -> int:
        """Memory allocated between the forward's last step and the backward's first."""
        return sum(b for _, b in self.handoff)

    def by_name(self) -> dict[str, Value]:
        return {v.name: v for v in self.values}

    def candidates(self) -> tuple[Value, ...]:
        """The values that get decisions, in production order; found once, as ``values`` never
        change (the program's builders ask for them thousands of times)."""
        found = self.__dict__.get("_candidates")
        if found is None:
            found = tuple(v for v in self.values if v.is_candidate)
            object.__setattr__(self, "_candidates", found)
        return found

    def workspace_at(self, step: int) -> int:
        return self.workspace[step] if self.workspace else 0


def storage_of(by_name: dict[str, Value], name: str) -> str:
    """The value whose storage ``name`` uses: a view (not savable, with operands) stands for
    its base's, followed back to a value with storage of its own."""
    while name in by_name and not by_name[name].savable and by_name[name].operands:
        name = by_name[name].operands[0]
    return name


def problem_to_dict(problem: Problem) -> dict:
    """``problem`` as JSON-able data (the plan cache stores it: a hit needs no profiling)."""
    return {"values": [{**asdict(v), "kind": v.kind.value} for v in problem.values],
            "num_forward_steps": problem.num_forward_steps, "num_steps": problem.num_steps,
            "workspace": list(problem.workspace), "step_names": list(problem.step_names),
            "outside": [list(p) for p in problem.outside], "kept_copies": problem.kept_copies,
            "handoff": [list(p) for p in problem.handoff],
            "meta": {k: str(v) for k, v in problem.meta.items()}}


def problem_from_dict(data: dict) -> Problem:
    """The inverse of :func:`problem_to_dict`; a field this version does not know is a ValueError."""
    known = {f.name for f in fields(Value)}
    values = []
    for row in data["values"]:
        unknown = set(row) - known
        if unknown:
            raise ValueError(f"problem value fields this remat does not know: {sorted(unknown)[:3]}")
        tuples = {k: tuple(row[k]) for k in ("operands", "keep_operands") if k in row}
        values.append(Value(**{**row, **tuples, "kind": Kind(row["kind"])}))
    return Problem(tuple(values), data["num_forward_steps"], data["num_steps"], tuple(data["workspace"]),
                   tuple(data["step_names"]), _parts(data, "outside"), data.get("kept_copies", 0),
                   _parts(data, "handoff"), dict(data.get("meta", {})))


def _parts(data: dict, name: str) -> tuple[Part, ...]:
    """The (what, bytes) parts stored under ``name`` (JSON gives lists), as the Problem holds them."""
    return tuple((str(what), int(nbytes)) for what, nbytes in data.get(name, ()))
