"""The live set a peak diff reads off each program (``bench/peak_diff.py``): the buffers alive at
its peak (:class:`Buffer`, :class:`LiveSet`), the three programs' names and titles, and the names the
programs compare by (an ATen op, a module path without the checkpoint wrapper, a summary row's module
group); shared by the eager reading (``bench/peak_diff_eager.py``), the compiled ones
(``bench/peak_diff_compiled.py``) and the report (``bench/peak_diff_report.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 2 ** 20
PROGRAMS = ("a", "b", "c")
TITLES = {"a": "(a) eager, checkpoint per block", "b": "(b) torch.compile, checkpoint per block",
          "c": "(c) remat, smallest feasible budget"}


@dataclass(frozen=True)
class Buffer:
    """One storage alive at a program's peak."""

    bytes: int
    role: str  # held | forward | kept | recomputed | backward | gradient | scratch | before
    module: str  # the module that made it ("blocks.2.attn"), "" for the model's own code
    op: str  # the ATen op that made it (under Inductor: the op of the FX node whose value it holds)
    born: str
    freed: str


@dataclass
class LiveSet:
    """A program's live set at its peak, and the peak as the budget counts it."""

    program: str  # "a", "b" or "c"
    measured_bytes: int  # remat.measure.budget_peak of a step of the program
    peak_at: str
    buffers: list[Buffer]
    notes: list[str] = field(default_factory=list)
    accounted_bytes: int | None = None  # (b), (c): the peak of inductor_account.step_account

    @property
    def live_bytes(self) -> int:
        return sum(b.bytes for b in self.buffers)


# --------------------------------------------------------------------------
# Names shared by the three programs
# --------------------------------------------------------------------------


def short_op(name: str) -> str:
    """``aten::addmm`` and ``aten.addmm.default`` both as ``addmm``: the programs compare by it."""
    name = name.split("::", 1)[-1]
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] in ("aten", "prims", "higher_order") else name


def unwrapped(path: str) -> str:
    """A module path without the ``Checkpointed`` wrapper's ``.block`` (``blocks.2.block.attn``
    is ``blocks.2.attn``), so the checkpointed and plain models name modules alike."""
    return re.sub(r"^(blocks\.\d+)\.block(?=\.|$)", r"\1", path)


def group_of(module: str) -> str:
    """The module a summary row groups by: the block index starred, two levels inside a block
    (``blocks.*.attn``, ``blocks.*.mlp``), one outside it (``lm_head``)."""
    parts = module.split(".") if module else []
    if len(parts) >= 2 and parts[0] == "blocks" and parts[1].isdigit():
        return ".".join(["blocks", "*", *parts[2:3]])
    return parts[0] if parts else "(model's own code)"


def held_buffer(nbytes: int, count: int) -> Buffer:
    """The parameters, buffers and batch, as one row: every program holds the same ones."""
    return Buffer(nbytes, "held", "", "", f"before the step ({count} tensors: parameters, buffers, batch)",
                  "held by the caller")
