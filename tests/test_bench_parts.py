"""Pieces of the benchmark: peers, the Pareto rows' bookkeeping, target checks and Hugging Face models."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from bench import hf_models, pareto, peers, render
from remat.zoo import build


def test_peers_cover_the_issue() -> None:
    names = [p.name for p in peers.PEERS]
    assert names[:3] == ["eager store-all", "eager checkpoint per block", "compile default"]
    for fraction in peers.BUDGET_FRACTIONS:
        assert f"compile budget {fraction} (dp)" in names
    assert "compile checkpoint per block" in names and "compile selective checkpoint (save matmuls)" in names
    assert peers.select(["budget 0.5"]) == [p for p in peers.PEERS if "budget 0.5" in p.name]
    with pytest.raises(ValueError, match="no peer matches"):
        peers.select(["nope"])


def test_checkpointed_blocks_wrap_and_restore() -> None:
    model, inputs = build("gpt", layers=2)
    originals = list(model.blocks)
    reference = model(*inputs)
    with peers.checkpointed_blocks(model, selective=True):
        assert all(isinstance(b, peers.Checkpointed) and b.selective for b in model.blocks)
        torch.testing.assert_close(model(*inputs), reference)
    assert list(model.blocks) == originals


def test_save_matmuls_policy() -> None:
    assert peers.save_matmuls(None, torch.ops.aten.mm.default) == CheckpointPolicy.MUST_SAVE
    assert peers.save_matmuls(None, torch.ops.aten.gelu.default) == CheckpointPolicy.PREFER_RECOMPUTE


def _row(policy: str, kind: str, peak: int, ms: float, **extra: object) -> dict:
    row = pareto.Row(policy, kind, peak_bytes=peak, step_ms=ms, **extra)
    return {**row.__dict__, "within_budget": row.within_budget}


def test_targets_and_summary_from_rows() -> None:
    rows = [
        _row("compile default", "peer", 100, 10.0),
        _row("compile checkpoint per block", "peer", 50, 12.0),
        _row("remat (no budget)", "remat", 100, 9.5, predicted_peak_bytes=100),
        _row("remat at compile default peak", "remat-matched", 100, 9.5, budget_bytes=100,
             matched_peer="compile default", predicted_peak_bytes=100),
        _row("remat at compile checkpoint per block peak", "remat-matched", 44, 10.4, budget_bytes=50,
             matched_peer="compile checkpoint per block", predicted_peak_bytes=45),
        _row("remat sweep 2%", "remat-sweep", 43, 11.0, budget_bytes=45, predicted_peak_bytes=43),
    ]
    checks = {c["target"]: c for c in render.targets("gpt", rows, sdpa=True)}
    assert checks["at equal measured peak, remat faster than every torch.compile policy"]["met"]
    assert checks["at the compile checkpoint-per-block peak, overhead over compile default <= 5 %"]["met"]
    assert checks["0.45x compile default's peak at <= 10 % overhead"]["met"]  # 44 B at +4 %
    assert checks["measured peak never over budget"]["met"]
    assert checks["lower budget never higher measured peak"]["met"]  # 43 B at budget 45, 44 B at 50
    line = render.summary_line("gpt", rows)
    assert "compile default 0.95x" in line and "compile checkpoint per block 0.87x" in line


def test_monotone_flags_a_higher_peak_at_a_lower_budget() -> None:
    rows = [_row("a", "remat-sweep", 60, 1.0, budget_bytes=60), _row("b", "remat-sweep", 55, 1.0, budget_bytes=70)]
    ok, bad = render.monotone(rows)
    assert not ok and "a (60 B at budget 60)" in bad[0]


@pytest.mark.skipif(not hf_models.available(), reason="transformers is not installed")
@pytest.mark.parametrize("name", ["hf-gpt2", "hf-llama", "hf-bert"])
def test_hf_models_train_and_expose_blocks(name: str) -> None:
    model, inputs = hf_models.build(name, layers=2, d_model=32, heads=2, seq=16, vocab=64, batch=2)
    assert len(peers.blocks_of(model)) == 2
    model(*inputs).backward()


@pytest.mark.parametrize("module", ["bench.peers", "bench.hf_models"])
def test_bench_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
