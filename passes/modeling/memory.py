"""Memory pass: liveness of the realized forward and backward graphs.

Scores the two graphs the partitioner actually built, storage by storage
(views share their base), with the forward's inputs alive throughout, the
values saved for the backward alive until their last backward use, the
user's outputs and the produced gradients alive to the end. The planner
compares this with the plan's prediction: the self-check of docs/design.md (the realized
graphs' peak, one of the four peaks ``passes/peaks.py`` names).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from remat.solvers.problem import Kind, Problem, Value
from remat.solvers.simulate import timeline

from ..costs.profile import multi_output_parent, storage_base, storage_bytes


@dataclass
class Liveness:
    """Storages by key: bytes, first step and last step alive."""

    size: dict[str, int] = field(default_factory=dict)
    start: dict[str, int] = field(default_factory=dict)
    end: dict[str, int] = field(default_factory=dict)

    def touch(self, key: str, step: int) -> None:
        self.end[key] = max(self.end.get(key, step), step)

    def allocate(self, key: str, nbytes: int, step: int) -> None:
        self.size[key] = max(self.size.get(key, 0), nbytes)
        self.start[key] = min(self.start.get(key, step), step)
        self.touch(key, step)

    def peak(self, num_steps: int) -> int:
        """The highest sum over steps, by the solvers' own simulator (one liveness rule for the
        plan and for the realized graphs): each storage a value alive on its interval."""
        values = tuple(Value(key, Kind.BACKWARD, nbytes, self.start[key], self.end[key])
                       for key, nbytes in self.size.items())
        return max(timeline(Problem(values, 0, num_steps), (), ()), default=0)


def walk(graph: fx.Graph, live: Liveness, keys: dict[str, str], first_step: int, prefix: str) -> int:
    """Allocate each node's storage at its step and extend what it reads."""
    step = first_step
    step_of: dict[str, int] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        step_of[node.name] = step
        for arg in node.all_input_nodes:
            if arg.name in keys:
                live.touch(keys[arg.name], step)
        base = storage_base(node)
        if base is not None and base.name in keys:
            keys[node.name] = keys[base.name]
            live.touch(keys[node.name], step)
        else:
            keys[node.name] = f"{prefix}:{node.name}"
            live.allocate(keys[node.name], storage_bytes(node.meta.get("val")), allocated_at(node, step, step_of))
        cost = node.meta.get("remat")
        if cost is not None and cost.workspace:
            live.allocate(f"{prefix}-scratch:{node.name}", cost.workspace, step)
        step += 1
    return step


def allocated_at(node: fx.Node, step: int, step_of: dict[str, int]) -> int:
    """Outputs of a multi-output op exist from the op's step, not their ``getitem``'s."""
    parent = multi_output_parent(node)
    return step_of.get(parent.name, step) if parent is not None else step


def outputs_of(graph: fx.Graph) -> list[fx.Node]:
    return list(graph.find_nodes(op="output")[0].all_input_nodes)


def realized_peak(forward: fx.GraphModule, backward: fx.GraphModule) -> int:
    """Peak bytes of running ``forward`` then ``backward`` op by op, unfused."""
    live, keys = Liveness(), {}
    for node in forward.graph.find_nodes(op="placeholder"):
        keys[node.name] = f"in:{node.name}"
        live.allocate(keys[node.name], storage_bytes(node.meta.get("val")), 0)
    fw_end = walk(forward.graph, live, keys, 0, "fw")
    saved = {n.name for n in backward.graph.find_nodes(op="placeholder")}
    for node in backward.graph.find_nodes(op="placeholder"):
        if node.name not in keys:  # tangents and other backward-only inputs arrive with it
            keys[node.name] = f"bw-in:{node.name}"
            live.allocate(keys[node.name], storage_bytes(node.meta.get("val")), fw_end)
    end = walk(backward.graph, live, keys, fw_end, "bw")
    last = max(end - 1, 0)
    for node in forward.graph.find_nodes(op="placeholder"):
        live.touch(keys[node.name], last)
    for node in outputs_of(forward.graph):
        if node.name not in saved and node.name in keys:  # the caller's outputs
            live.touch(keys[node.name], last)
    for node in outputs_of(backward.graph):
        if node.name in keys:
            live.touch(keys[node.name], last)
    for name in saved:
        if name in keys:
            live.touch(keys[name], fw_end - 1)
    return live.peak(max(end, 1))


def recomputed_in(backward: fx.GraphModule, forward_names: set[str]) -> set[str]:
    """Forward nodes the backward graph computes again."""
    return {n.name for n in backward.graph.nodes if n.op == "call_function" and n.name in forward_names}
