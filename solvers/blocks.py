"""Identical repeated blocks, and one set of decisions for their interior copies.

A model's layers (``Value.block``: ``"blocks.3"``, ``"model.layers.7"``) repeat the same
ops on the same shapes, and the best plans repeat too: on a 12-layer GPT-style graph the
program's optimum keeps the same positions in 11 of 12 blocks. The smallest-peak search
(``min_peak``) therefore solves a smaller program where every interior block of a list
(all but the first and the last, which meet the embedding and the head) takes the
decisions of the first interior one: the binaries shrink by about the depth, while the
memory rows stay those of the whole graph, so the program still counts every copy's bytes
at its own steps and its plans are exact under the simulator (FORMULATION.md, "Shared
blocks"). It is a restriction: its optimum is a valid plan, never below the whole
program's, equal where the optimum repeats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence

from .problem import Kind, Problem, Value
from .solution import Solution

Ties = dict[str, str]  # value of an interior copy -> the same value of the representative copy


def shared_decisions(problem: Problem, recomputable: Collection[str], period: int = 1) -> Ties:
    """For each list of identical blocks, every interior copy's candidates tied to those of the
    interior copy ``period`` places before it (so ``period`` representatives take the decisions:
    adjacent blocks often alternate, one keeping its output and the next its input). A copy that
    differs (``signature``) keeps its own decisions."""
    members = _members(problem)
    ties: Ties = {}
    for blocks in _lists(members).values():
        interior = blocks[1:-1]
        signatures = {block: signature(members, block, blocks, recomputable) for block in interior}
        for k in range(period, len(interior)):
            block, rep = interior[k], interior[k % period]
            if signatures[block] == signatures[rep]:
                ties.update((v.name, r.name) for v, r in zip(members[block], members[rep]) if v.is_candidate)
    return ties


def _members(problem: Problem) -> dict[str, list[Value]]:
    """Each block's FORWARD values in production order."""
    members: dict[str, list[Value]] = defaultdict(list)
    for v in problem.values:
        if v.kind is Kind.FORWARD and v.block:
            members[v.block].append(v)
    return members


def _lists(members: dict[str, list[Value]]) -> dict[str, list[str]]:
    """Blocks grouped by their list (the label before its index), in production order."""
    lists: dict[str, list[str]] = defaultdict(list)
    for block in members:
        lists[block.rpartition(".")[0]].append(block)
    return lists


def signature(members: dict[str, list[Value]], block: str, blocks: list[str], recomputable: Collection[str]) -> tuple:
    """What two copies must share for one set of decisions to mean the same in both: per value,
    the op, bytes, which decisions exist (savable, recomputable, needed), and each operand as a
    position in this block, in the block before it, or a name outside the blocks."""
    index = {v.name: (0, i) for i, v in enumerate(members[block])}
    k = blocks.index(block)
    if k:
        index.update({v.name: (-1, i) for i, v in enumerate(members[blocks[k - 1]])})
    return tuple(
        (v.op, v.bytes, v.held_when_recomputed, v.fused_in_forward, v.savable, v.is_candidate,
         v.direct_need, v.name in recomputable,
         tuple(index.get(u, u) for u in v.operands), tuple(index.get(u, u) for u in v.keep_operands))
        for v in members[block])


def consistent(saved: Collection[str], recomputed: Collection[str], ties: Ties) -> bool:
    """Whether a plan takes the same decisions in every tied copy (a program with ``ties``
    can express it)."""
    return all((a in saved) == (r in saved) and (a in recomputed) == (r in recomputed) for a, r in ties.items())


def longest_list(problem: Problem) -> int:
    """How many blocks the longest list of ``problem`` has (``Value.block``; 0 without blocks)."""
    return max(map(len, _lists(_members(problem)).values()), default=0)


def tied_blocks(problem: Problem, ties: Ties) -> int:
    """How many blocks take one shared set of decisions (representatives included)."""
    by_name = problem.by_name()
    return len({by_name[name].block for pair in ties.items() for name in pair})


Fixed = dict[str, tuple[bool, bool]]  # value -> (kept, recomputed), decided before the solve


def agreed_decisions(problem: Problem, plans: Sequence[Solution]) -> Fixed:
    """For each set of blocks built alike (``shape``: the first and the last of a list
    included), the decisions that every one of ``plans`` takes alike at a position of every
    block. At the other positions each block decides for itself; every plan given takes the
    decisions returned, so fixing them is a restriction of the program, never a change."""
    members = _members(problem)
    fixed: Fixed = {}
    for blocks in _lists(members).values():
        groups: dict[tuple, list[str]] = defaultdict(list)
        for block in blocks:
            groups[shape(members[block])].append(block)
        for group in (g for g in groups.values() if len(g) >= 2):
            copies = [[v.name for v in members[block] if v.is_candidate] for block in group]
            for position in zip(*copies):
                taken = {(name in plan.saved, name in plan.recomputed) for plan in plans for name in position}
                if len(taken) == 1:
                    fixed.update(dict.fromkeys(position, taken.pop()))
    return fixed


def shape(block: list[Value]) -> tuple:
    """A block's candidates as op, bytes and the decisions that exist: what positions of two
    blocks must share for a decision to be compared between them (operands may differ)."""
    return tuple((v.op, v.bytes, v.savable, v.direct_need) for v in block if v.is_candidate)


def takes(plan: Solution, fixed: Fixed) -> bool:
    """Whether ``plan`` takes every decision of ``fixed``."""
    return all((name in plan.saved, name in plan.recomputed) == kr for name, kr in fixed.items())
