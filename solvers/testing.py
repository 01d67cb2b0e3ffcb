"""Build consistent Problems from small graph descriptions, and random ones.

Used by tests here and elsewhere: ``build_problem`` derives ``last_use``,
``need_start``/``need_end``, ``direct_need`` and ``operands`` exactly as the
Value docstring defines them, so hand-written tests only state the graph.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .errors import InvalidPlan
from .problem import Kind, Problem, Value
from .simulate import evaluate
from .solution import Solution


@dataclass(frozen=True)
class Node:
    """One graph node. ``reads`` names any earlier node or input.

    A forward ``view`` aliases its single read: no bytes, never kept. An
    ``output`` forward node is held by the caller through the backward; a
    ``grad`` backward node is a produced gradient, alive to the end. ``block``
    names the repeated block a forward node belongs to ("" for none).
    """

    name: str
    bytes: int = 0
    reads: tuple[str, ...] = ()
    view: bool = False
    ban: str | None = None
    recompute_seconds: float = 0.0
    save_seconds: float = 0.0
    output: bool = False
    grad: bool = False
    block: str = ""


def build_problem(
    inputs: Sequence[tuple[str, int]],
    forward: Sequence[Node],
    backward: Sequence[Node],
    workspace: Sequence[int] = (),
) -> Problem:
    """Forward nodes take steps 0.., backward nodes follow them."""
    num_forward, num_steps = len(forward), len(forward) + len(backward)
    fwd_step = {n.name: i for i, n in enumerate(forward)}
    fwd_reads, bwd_reads = _fold_aliases(forward, backward, fwd_step)
    need = _need_intervals(forward, fwd_step, bwd_reads)
    values = [Value(name, Kind.INPUT, nbytes, 0, num_steps - 1) for name, nbytes in inputs]
    for i, node in enumerate(forward):
        last = num_steps - 1 if node.output else max(fwd_reads[node.name], default=i)
        start, end = need.get(node.name, (None, None))
        values.append(
            Value(
                node.name, Kind.FORWARD, 0 if node.view else node.bytes, i, last,
                op="view" if node.view else "op", need_start=start, need_end=end,
                direct_need=bool(bwd_reads[node.name]),
                direct_start=min(bwd_reads[node.name], default=None),
                operands=tuple(r for r in node.reads if r in fwd_step),
                recompute_ban=node.ban, savable=not node.view,
                recompute_seconds=node.recompute_seconds, save_seconds=node.save_seconds, block=node.block,
            )
        )
    values += _backward_values(backward, num_forward, num_steps)
    return Problem(tuple(values), num_forward, num_steps, tuple(workspace))


def _fold_aliases(
    forward: Sequence[Node], backward: Sequence[Node], fwd_step: dict[str, int]
) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """Steps reading each forward value or any alias of it, split by phase."""
    fwd_reads: dict[str, set[int]] = {n.name: set() for n in forward}
    bwd_reads: dict[str, set[int]] = {n.name: set() for n in forward}
    for step, node in enumerate([*forward, *backward]):
        reads = fwd_reads if step < len(forward) else bwd_reads
        for r in node.reads:
            if r in fwd_step:
                reads[r].add(step)
    for node in reversed(forward):  # a view's reads count as its base's
        if node.view:
            fwd_reads[node.reads[0]] |= fwd_reads[node.name]
            bwd_reads[node.reads[0]] |= bwd_reads[node.name]
    return fwd_reads, bwd_reads


def _need_intervals(
    forward: Sequence[Node], fwd_step: dict[str, int], bwd_reads: dict[str, set[int]]
) -> dict[str, tuple[int, int]]:
    """need_start/need_end as the FX problem builder derives them, except that a recomputation
    counts at the step of the read it is for, where the FX builder counts it at the step before
    (``passes.problem.recompute_step``); the memory model takes either as given.

    A value may be needed at its direct backward reads and wherever a
    forward user may be recomputed: ``need_start`` is the earliest of these
    over every chain of users, ``need_end`` bounds the latest.
    """
    users: dict[str, list[str]] = {n.name: [] for n in forward}
    for node in forward:
        for r in node.reads:
            if r in fwd_step:
                users[r].append(node.name)
    need: dict[str, tuple[int, int]] = {}
    latest: dict[str, int] = {}
    for node in reversed(forward):  # users come after their operands
        direct = sorted(bwd_reads[node.name])
        needy = [w for w in users[node.name] if w in need]
        starts = direct + [need[w][0] for w in needy]
        if not starts:
            continue
        latest[node.name] = direct[0] if direct else max(latest[w] for w in needy)
        need[node.name] = (min(starts), max(direct + [latest[w] for w in needy]))
    return need


def _backward_values(backward: Sequence[Node], num_forward: int, num_steps: int) -> list[Value]:
    last_read: dict[str, int] = {}
    for j, node in enumerate(backward):
        for r in node.reads:
            last_read[r] = num_forward + j
    return [
        Value(
            node.name, Kind.BACKWARD, node.bytes, num_forward + j,
            num_steps - 1 if node.grad else last_read.get(node.name, num_forward + j),
        )
        for j, node in enumerate(backward)
    ]


def random_problem(seed: int, n_forward: int, n_backward: int, *, n_inputs: int = 2) -> Problem:
    """A random but consistent Problem: a forward DAG with views and banned
    ops, a backward reading some forward values, random workspace."""
    rng = random.Random(seed)
    inputs = [(f"in{i}", rng.randint(1, 64)) for i in range(n_inputs)]
    forward: list[Node] = []
    for i in range(n_forward):
        forward.append(_random_forward(rng, f"f{i}", forward, [n for n, _ in inputs]))
    if forward:
        forward[-1] = replace(forward[-1], output=True)
    backward: list[Node] = []
    for j in range(n_backward):
        reads = rng.sample(forward, min(len(forward), rng.choice((0, 1, 1, 2))))
        reads += rng.sample(backward, min(len(backward), rng.choice((0, 1, 2))))
        backward.append(
            Node(f"b{j}", rng.randint(1, 100), tuple(n.name for n in reads), grad=rng.random() < 0.3)
        )
    steps = n_forward + n_backward
    workspace = [rng.randint(1, 50) if rng.random() < 0.3 else 0 for _ in range(steps)]
    return build_problem(inputs, forward, backward, workspace)


def _random_forward(rng: random.Random, name: str, earlier: list[Node], inputs: list[str]) -> Node:
    if earlier and rng.random() < 0.15:
        return Node(name, reads=(rng.choice(earlier).name,), view=True)
    reads = [n.name for n in rng.sample(earlier, min(len(earlier), rng.choice((0, 1, 1, 2))))]
    if not reads or rng.random() < 0.3:
        reads.append(rng.choice(inputs))
    return Node(
        name,
        rng.randint(1, 100),
        tuple(reads),
        ban="random op" if rng.random() < 0.1 else None,
        recompute_seconds=round(rng.uniform(0.01, 1.0), 4),
        save_seconds=0.0 if rng.random() < 0.5 else round(rng.uniform(0.0, 0.3), 4),
    )


def brute_force(problem: Problem, *, max_savable: int = 16) -> list[Solution]:
    """Every canonical valid plan: keep each subset of the savable candidates
    and recompute its closure. Exponential: small problems only."""
    savable = [v.name for v in problem.candidates() if v.savable]
    if len(savable) > max_savable:
        raise ValueError(f"brute_force: {len(savable)} savable candidates, at most {max_savable}")
    plans = []
    for mask in range(1 << len(savable)):
        saved = {name for i, name in enumerate(savable) if mask >> i & 1}
        try:
            plans.append(evaluate(problem, saved, solver="brute-force"))
        except InvalidPlan:
            continue
    return plans


def chain_of_blocks(layers: int, seed: int = 0, width: int = 3, *, odd: int | None = None) -> Problem:
    """``layers`` identical blocks of ``width`` ops (one random template: bytes, costs, which
    earlier op of the block each reads, which ones the backward reads), between an input and a
    loss; the backward runs the blocks in reverse, each giving a parameter gradient. ``odd``:
    the index of one block whose first op is larger (a copy that is not identical)."""
    rng = random.Random(seed)
    template = [(rng.randint(10, 100), round(rng.uniform(0.01, 1.0), 3), rng.randrange(i) if i > 1 else None,
                 rng.random() < 0.6) for i in range(width)]
    forward: list[Node] = []
    backward: list[Node] = []
    previous = "x"
    for j in range(layers):
        names = [f"l{j}_{i}" for i in range(width)]
        for i, (nbytes, seconds, extra, _) in enumerate(template):
            reads = (previous, "w") if i == 0 else (names[i - 1], *(() if extra is None else (names[extra],)))
            size = nbytes + (7 if j == odd and i == 0 else 0)
            forward.append(Node(names[i], size, reads, recompute_seconds=seconds, block=f"layers.{j}"))
        previous = names[-1]
    forward.append(Node("loss", 4, (previous,), output=True))
    for j in reversed(range(layers)):
        read = tuple(f"l{j}_{i}" for i, (*_, needed) in enumerate(template) if needed)
        backward.append(Node(f"d{j}", 30, read + ((f"d{j + 1}",) if j + 1 < layers else ())))
        backward.append(Node(f"gw{j}", 5, (f"d{j}",), grad=True))
    return build_problem([("x", 20), ("w", 10)], forward, backward)
