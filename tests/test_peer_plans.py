"""The plan space contains the peers: checkpoint per block and save-matmuls, expressed in
remat's model on graphs captured from the bench's models, are valid plans, and at each one's
predicted peak remat's plan is predicted no slower (torch's min-cut: tests/test_lazy_figures.py)."""

from __future__ import annotations

import pytest

from bench import hf_models
from remat.frontier import capture
from remat.options import Options
from remat.solvers import Problem, checkpoint_blocks, save_matmuls, store_all
from remat.solvers.plan import Request, solve
from tests.conftest import build

LAYERS = 2
MODELS = {
    "gpt": {"layers": LAYERS}, "gpt-softmax": {"layers": LAYERS}, "llama": {"layers": LAYERS},
    "vit": {"layers": LAYERS}, "convnet": {"blocks": LAYERS},
    "hf-gpt2": {"layers": LAYERS}, "hf-llama": {"layers": LAYERS}, "hf-bert": {"layers": LAYERS},
}
_CAPTURED: dict[str, tuple[Problem, list[str]]] = {}


def captured(name: str) -> tuple[Problem, list[str]]:
    """The model's problem (eager memory model) and the paths of its ``.blocks``, once per session."""
    if name not in _CAPTURED:
        if name.startswith("hf-"):
            if not hf_models.available():
                pytest.skip("transformers is not installed (the hf extra)")
            model, inputs = hf_models.build(name, **MODELS[name])
        else:
            model, inputs = build(name, **MODELS[name])
        paths = {id(m): path for path, m in model.named_modules()}
        blocks = [paths[id(block)] for block in model.blocks]
        _CAPTURED[name] = capture(model, inputs, Options(compiler="eager")).problem, blocks
    return _CAPTURED[name]


@pytest.mark.parametrize("name", MODELS)
def test_every_value_of_a_block_is_labelled_with_the_models_block(name: str) -> None:
    problem, blocks = captured(name)
    labels = {v.block for v in problem.values if v.block}
    # the HF wrapper reaches its layers through the wrapped model, as dynamo does
    assert {label.split(".", 1)[-1] if name.startswith("hf-") else label for label in labels} \
        == {path.split(".", 1)[-1] if name.startswith("hf-") else path for path in blocks}
    # each block holds many ops (a constant torch shares between blocks is computed in the first)
    assert all(sum(v.block == label for v in problem.values) > 3 for label in labels)


def test_checkpoint_per_block_in_the_model_peaks_below_store_all_on_a_transformer() -> None:
    problem, _ = captured("gpt")
    assert checkpoint_blocks(problem).peak_bytes < store_all(problem).peak_bytes


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("peer", [checkpoint_blocks, save_matmuls], ids=["checkpoint-blocks", "save-matmuls"])
def test_remat_at_a_peers_peak_is_no_slower_than_the_peer(name: str, peer) -> None:  # type: ignore[no-untyped-def]
    problem, _ = captured(name)
    theirs = peer(problem)
    ours, _ = solve(problem, Request(budget_bytes=theirs.peak_bytes, time_limit_s=5.0))
    assert ours.peak_bytes <= theirs.peak_bytes
    assert ours.added_seconds <= theirs.added_seconds + 1e-12
