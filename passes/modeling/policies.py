"""Decisions as policies: small named rules that pin some values' keep/recompute decision.

A policy looks at one node of the joint graph's forward and says ``MUST_SAVE``,
``MUST_RECOMPUTE`` or nothing (``None``: no opinion), with a reason; the ILP
decides every value no policy pins. Policies compose with ``|``: the first with an
opinion wins, left to right. remat always applies :data:`SAFETY` first, so a
user's policy can never make remat recompute a random op, a mutation or an
untagged collective. In the spirit of JAX's ``checkpoint_policies``::

    import remat
    from remat.policies import save_matmuls
    remat.compile(model, budget_gb=20, policy=save_matmuls)   # Megatron-style, exactly
    remat.compile(model, budget_gb=20, policy=remat.policies.save_ops("addmm"))  # pin some, solve the rest
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch.fx as fx

from ..capture import taxonomy
from .. import torch_adapter as adapter


class Pin(str, Enum):
    MUST_SAVE = "must save"
    MUST_RECOMPUTE = "must recompute"


@dataclass(frozen=True)
class Verdict:
    pin: Pin
    reason: str


Rule = Callable[[fx.Node], "Verdict | None"]


@dataclass(frozen=True)
class Policy:
    """A named rule: ``policy(node)`` is a :class:`Verdict` or None (no opinion).

    The name identifies the policy in reports and in the plan cache's key: give each
    policy of your own a name that changes when its rule does.
    """

    name: str
    rule: Rule

    def __call__(self, node: fx.Node) -> Verdict | None:
        return self.rule(node)

    def __or__(self, other: Policy) -> Policy:
        if not isinstance(other, Policy):
            return NotImplemented
        return Policy(f"{self.name} | {other.name}", lambda node: self(node) or other(node))

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"


def _random(node: fx.Node) -> Verdict | None:
    if taxonomy.is_random(node):
        return Verdict(Pin.MUST_SAVE, "random op: recomputing it would draw new random numbers")
    return None


def _mutation(node: fx.Node) -> Verdict | None:
    schema = adapter.op_schema(node)
    return Verdict(Pin.MUST_SAVE, "mutates its input") if schema is not None and schema.is_mutable else None


def _collective(node: fx.Node) -> Verdict | None:
    """An untagged collective is never recomputed (a tagged one follows its tag: :data:`user_tags`)."""
    if adapter.is_collective(node) and adapter.recompute_tag(node) is None:
        return Verdict(Pin.MUST_SAVE, "collective")
    return None


def _user_tags(node: fx.Node) -> Verdict | None:
    """``torch.utils.checkpoint`` selective-checkpoint tags, as torch's partitioner honours them."""
    tag = adapter.recompute_tag(node)
    if tag == "must_save":
        return Verdict(Pin.MUST_SAVE, "checkpoint policy MUST_SAVE")
    if tag == "must_recompute":
        return Verdict(Pin.MUST_RECOMPUTE, "checkpoint policy MUST_RECOMPUTE")
    return None


def in_checkpoint_region(node: fx.Node) -> bool:
    """Whether ``node`` is inside a region the model wraps in ``torch.utils.checkpoint`` (torch
    tags each such op PREFER_RECOMPUTE)."""
    return adapter.recompute_tag(node) == "prefer_recompute"


def _checkpoint_region(node: fx.Node) -> Verdict | None:
    """An op inside a checkpoint region: recomputed, as the model asks and as torch does."""
    if in_checkpoint_region(node):
        return Verdict(Pin.MUST_RECOMPUTE, "inside a torch.utils.checkpoint region: recomputed as the model asks "
                                           "(checkpoint_regions=\"plan\" lets remat decide)")
    return None


never_recompute_random = Policy("never-recompute-random", _random)
never_recompute_mutations = Policy("never-recompute-mutations", _mutation)
never_recompute_collectives = Policy("never-recompute-untagged-collectives", _collective)
user_tags = Policy("checkpoint-tags", _user_tags)
# Applied after SAFETY unless ``checkpoint_regions="plan"`` (remat.Options): see :func:`with_regions`.
recompute_checkpoint_regions = Policy("recompute-checkpoint-regions", _checkpoint_region)
# Always first: what would be wrong to recompute, then what the user tagged in the model.
SAFETY = never_recompute_random | never_recompute_mutations | user_tags | never_recompute_collectives


def _save_matmuls(node: fx.Node) -> Verdict:
    if taxonomy.node_category(node) in taxonomy.SAVED_BY_SELECTIVE:
        return Verdict(Pin.MUST_SAVE, "policy save-matmuls: a matmul-class output")
    return Verdict(Pin.MUST_RECOMPUTE, "policy save-matmuls: not a matmul-class output")


# Megatron-style selective checkpointing: keep what matmul-class ops (matmul, attention,
# convolution) produce, recompute everything else. With it nothing is left to the ILP.
save_matmuls = Policy("save-matmuls", _save_matmuls)


def save_ops(*names: str) -> Policy:
    """Keep the outputs of the ops named (``"addmm"``, ``"_softmax"``...); the ILP decides the rest."""
    return _pin_ops("save", Pin.MUST_SAVE, names)


def recompute_ops(*names: str) -> Policy:
    """Recompute the outputs of the ops named; the ILP decides the rest."""
    return _pin_ops("recompute", Pin.MUST_RECOMPUTE, names)


def _pin_ops(verb: str, pin: Pin, names: tuple[str, ...]) -> Policy:
    wanted = frozenset(names)

    def rule(node: fx.Node) -> Verdict | None:
        if node.op == "call_function" and taxonomy.op_name(node.target) in wanted:
            return Verdict(pin, f"policy {verb}_ops: {taxonomy.op_name(node.target)}")
        return None

    return Policy(f"{verb}-ops({','.join(sorted(wanted))})", rule)


BUILT_IN = {p.name: p for p in (save_matmuls, never_recompute_random, never_recompute_mutations,
                                never_recompute_collectives, user_tags, recompute_checkpoint_regions)}


def policy_named(policy: Policy | str | None) -> Policy | None:
    """``policy`` itself, or the built-in policy of that name; a clear error for anything else."""
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) and policy in BUILT_IN:
        return BUILT_IN[policy]
    raise ValueError(f"policy must be a remat.policies.Policy or one of {sorted(BUILT_IN)}, not {policy!r}")


def with_regions(policy: Policy | None, regions: str) -> Policy | None:
    """The user's policy after the model's own checkpoint regions, unless ``regions`` is
    "plan" (remat decides inside them too): a region the user wrapped in ``checkpoint`` is
    recomputed as asked, whatever the policy says of its ops."""
    if regions == "plan":
        return policy
    return recompute_checkpoint_regions if policy is None else recompute_checkpoint_regions | policy


def with_safety(policy: Policy | None) -> Policy:
    """What the problem pass applies: :data:`SAFETY`, then the user's policy."""
    return SAFETY if policy is None else SAFETY | policy
