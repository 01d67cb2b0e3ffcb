"""Matmuls Inductor folds into the add that reads them (``addmm_folded``, passes/problem.py's order).

Inductor's post-grad pattern turns ``add(mm(a, b), c)`` into ``addmm(c, a, b)`` at the add, so
the matmul runs there and its inputs live until then. With tied embeddings the LM head's weight
gradient is added to the embedding's at the end of the backward, which holds the logits
gradient through the whole backward: remat's order under Inductor must say so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from remat.passes import torch_adapter as adapter
from remat.passes.problem import fixed_order

from .helpers import Captured, aten, traced_joint


class TiedLM(nn.Module):
    """An embedding whose weight is also the LM head's (GPT-2's tying)."""

    def __init__(self, vocab: int = 64, d: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.body = nn.Linear(d, d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(self.embed(idx)))
        logits = F.linear(h, self.embed.weight)  # an LM head tied to the embedding, as GPT-2 ties them
        return F.cross_entropy(logits.flatten(0, 1), idx.flatten())


def tied_joint(**inductor_settings) -> Captured:
    """The tied LM's joint graph as remat gets it under Inductor (after Inductor's joint-graph
    passes, which drop the head's pair of transposes), with torch's min-cut plan, compiled and run."""
    got = Captured()

    def choose(joint, info):
        got.joint, got.info = joint, info
        return adapter.min_cut_saved_values(joint, info)

    def backend(gm, example_inputs):
        with adapter.saved_values_chooser(choose):
            return adapter.compile_inductor(gm, example_inputs, on_graph=lambda graph, kind: None)

    torch.manual_seed(0)
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False, **inductor_settings):
        torch.compile(TiedLM(), backend=backend)(torch.randint(0, 64, (2, 8))).backward()
    return got


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


def test_the_tied_head_gradient_runs_at_the_add_under_inductor() -> None:
    got = tied_joint()
    ops = [n for n in got.joint.nodes if n.op == "call_function"]
    folded = {add: adapter.addmm_folded(add) for add in ops}
    folded = {add: mm for add, mm in folded.items() if mm is not None and not got.info.is_required_fw(add)}
    assert len(folded) == 1, folded  # the tied weight's two gradients summed
    (add, mm), = folded.items()
    plain = names(fixed_order(got.joint, got.info).steps)
    inductor = names(fixed_order(got.joint, got.info, inductor=True).steps)
    assert sorted(plain) == sorted(inductor)
    assert plain.index(mm.name) < plain.index(add.name) - 1  # listed early: its inputs die there
    assert inductor.index(mm.name) == inductor.index(add.name) - 1  # Inductor runs it at the add


def test_the_fold_follows_torchs_rule() -> None:
    def joint(a_1, b_1, c_1, h_1):
        m1 = aten.mm(a_1, b_1)
        s1 = aten.add(m1, c_1)            # folded
        m2 = aten.mm(a_1, b_1)
        s2 = aten.add(c_1, m2)            # folded, either side
        m3 = aten.mm(a_1, b_1)
        s3 = aten.add(m3, c_1)            # not: the matmul has another reader
        t3 = aten.relu(m3)
        m4 = aten.mm(a_1, b_1)
        s4 = aten.add(m4, c_1, alpha=2)   # not: a scaled add is not the pattern
        m5 = aten.mm(a_1, b_1)
        s5 = aten.add(m5, h_1)            # not: half and float
        m6 = aten.mm(a_1, b_1)
        s6 = aten.add(m6, 1.0)            # not: a number
        return [s1, s2, s3, t3, s4, s5, s6]

    a, b, c = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    gm, _ = traced_joint(joint, a, b, c, torch.randn(4, 5).half(), num_fwd_outputs=7)
    folded = {n.name: adapter.addmm_folded(n) for n in gm.graph.nodes if n.target is aten.add.Tensor}
    assert {add: mm.name for add, mm in folded.items() if mm is not None} == {"add": "mm", "add_1": "mm_1"}


def test_inductor_folds_what_the_rule_says() -> None:
    """Pinned against Inductor itself: its backward graph has one more addmm after its post-grad
    passes than before them for each add of the backward the rule folds."""
    seen = {"before": 0, "after": 0}

    def counter(when: str):
        def count(graph) -> None:
            seen[when] += sum(n.target is aten.addmm.default for n in graph.nodes)
        return count

    got = tied_joint(post_grad_custom_pre_pass=counter("before"), post_grad_custom_post_pass=counter("after"))
    folds = [n for n in got.joint.nodes
             if n.op == "call_function" and not got.info.is_required_fw(n) and adapter.addmm_folded(n) is not None]
    assert len(folds) == 1
    assert seen["after"] - seen["before"] == len(folds)
