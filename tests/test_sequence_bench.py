"""The sequence-length benchmark (bench.sequence): its pure parts on hand-made rows, one smoke run end to
end, and the Hugging Face T5 model it measures trained by remat as eager trains it."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import remat
from bench import hf_models, peers, sequence

MIB = 2**20


def _row(model: str, seq: int, policy: str, peak_mib: float | None, status: str = "ok",
         budget_mib: float | None = None) -> dict:
    kind = "remat" if policy == sequence.REMAT else "peer"
    budget = None if budget_mib is None else int(budget_mib * MIB)
    peak = None if peak_mib is None else int(peak_mib * MIB)
    within = None if status != "ok" or budget is None else peak <= budget
    return {"model": model, "seq": seq, "policy": policy, "kind": kind, "status": status, "peak_bytes": peak,
            "budget_bytes": budget, "within_budget": within}


def _rows() -> list[dict]:
    """gpt at 128, 256, 512: eager store-all grows 10, 20, 40 MiB; checkpoint per block 6, 12, 24; remat's
    smallest feasible 5, 9, 17 with measured peaks 5, 9, 18 (over its budget at 512); one peer fails at 512."""
    rows = []
    for seq, (store, block, small, measured) in {128: (10, 6, 5, 5), 256: (20, 12, 9, 9),
                                                 512: (40, 24, 17, 18)}.items():
        rows += [_row("gpt", seq, "eager store-all", store), _row("gpt", seq, sequence.BASE, block),
                 _row("gpt", seq, sequence.REMAT, measured, budget_mib=small)]
        rows.append(_row("gpt", seq, "compile budget 0.0 (dp)", None, "error: RuntimeError: boom")
                    if seq == 512 else _row("gpt", seq, "compile budget 0.0 (dp)", block - 1))
    return rows


def test_longest_sequence_under_a_budget() -> None:
    rows = _rows()
    table = sequence.longest(rows, 12 * MIB)["gpt"]
    assert table["eager store-all"] == 128 and table[sequence.BASE] == 256
    assert table[sequence.REMAT] == 256 and table["compile budget 0.0 (dp)"] == 256
    assert table["compile checkpoint per block"] is None  # never measured
    assert sequence.longest(rows, 4 * MIB)["gpt"][sequence.REMAT] is None
    # 18 MiB: remat's smallest feasible at 512 fits (17) and so does its measured peak (18)
    assert sequence.longest(rows, 18 * MIB)["gpt"][sequence.REMAT] == 512
    # at 17.5 its smallest feasible fits but its measured peak does not
    assert sequence.longest(rows, int(17.5 * MIB))["gpt"][sequence.REMAT] == 256
    # a failed row never fits
    assert sequence.longest(rows, 100 * MIB)["gpt"]["compile budget 0.0 (dp)"] == 256


def test_remat_fits_only_when_its_smallest_feasible_budget_does() -> None:
    row = _row("gpt", 128, sequence.REMAT, 5, budget_mib=9)
    assert not sequence.fits(row, 8 * MIB) and sequence.fits(row, 9 * MIB)
    assert sequence.fits(_row("gpt", 128, "eager store-all", 8), 8 * MIB)


def test_default_budget_is_checkpoint_per_block_at_the_median_length() -> None:
    assert sequence.default_budget(_rows(), "gpt", [128, 256, 512]) == 12 * MIB
    assert sequence.default_budget(_rows(), "gpt", [128, 256, 512, 1024]) == 12 * MIB  # the lower middle
    assert sequence.default_budget(_rows(), "llama", [128]) is None


def test_tables_render_peaks_ratios_and_failures() -> None:
    rows = _rows()
    table = sequence.model_table(rows, "gpt").splitlines()
    assert table[0].startswith("| seq | eager store-all | eager checkpoint per block |") and len(table) == 5
    assert table[2] == ("| 128 | 10.00 | 6.00 |  |  |  | 5.00 | 5.00 | 5.00 (yes) | 0.833 | 0.833 |")
    assert table[4] == "| 512 | 40.00 | 24.00 |  |  |  | error | 17.00 | 18.00 (**no**) | 0.708 | 0.750 |"
    longest = sequence.longest_table(sequence.longest(rows, 12 * MIB)).splitlines()
    assert longest[2] == "| gpt | 128 | 256 | none | none | none | 256 | 256 |"
    text = sequence.markdown(rows, 12 * MIB, {"layers": 1})
    assert "## gpt" in text and "## Longest sequence under 12.00 MiB" in text
    assert "- gpt, seq 512, compile budget 0.0 (dp): error: RuntimeError: boom" in text


def test_sizes_follow_the_overrides() -> None:
    assert sequence.size_of("gpt", 256, {"layers": 3}) == {**sequence.SIZE, "layers": 3, "seq": 256}
    assert sequence.size_of("llama", 64, {"d_model": 96})["hidden"] == 256
    assert sequence.size_of("llama", 64, {"hidden": 100})["hidden"] == 100


def test_sequence_smoke_writes_a_row_per_length_and_policy(tmp_path: pathlib.Path) -> None:
    sizes = ["--set", "layers=1", "--set", "d_model=32", "--set", "heads=2", "--set", "vocab=64"]
    sequence.main(["--smoke", "--models", "gpt", "--seqs", "16", "32", *sizes, "--out", str(tmp_path), "--tag", "tiny"])
    [result] = tmp_path.glob("*-cpu-smoke-sequence-tiny.json")  # (--tag names a run at other sizes)
    data = json.loads(result.read_text())
    assert data["meta"]["command"].startswith("python -m bench.sequence --smoke --models gpt")
    assert data["meta"]["torch"] == torch.__version__ and data["meta"]["cpu"] and data["meta"]["date"]
    keys = [(r["seq"], r["policy"]) for r in data["rows"]]
    assert sorted(keys) == sorted((s, p) for s in (16, 32) for p in sequence.POLICIES)
    assert all(r["status"] == "ok" and r["peak_bytes"] > 0 for r in data["rows"]), data["rows"]
    ours = [r for r in data["rows"] if r["policy"] == sequence.REMAT]
    assert all(r["budget_bytes"] > 0 and isinstance(r["within_budget"], bool) for r in ours)
    budget = data["meta"]["budget_bytes"]
    base = next(r for r in data["rows"] if (r["seq"], r["policy"]) == (16, sequence.BASE))
    assert budget == base["peak_bytes"] and set(data["longest"]["gpt"]) == set(sequence.POLICIES)
    text = result.with_suffix(".md").read_text()
    assert "## gpt\n" in text and "## Longest sequence under" in text and "| 32 |" in text
    assert result.with_suffix(".png").stat().st_size > 0


@pytest.mark.skipif(not hf_models.available(), reason="transformers is not installed")
def test_t5_trained_by_remat_as_by_eager() -> None:
    model, inputs = hf_models.build("hf-t5", layers=1, d_model=32, heads=2, seq=16, vocab=64, batch=2)
    assert len(peers.blocks_of(model)) == 2
    model(*inputs).backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with peers.checkpointed_blocks(model):  # the wrapper reaches the blocks T5 runs
        assert isinstance(model.hf.decoder.block[0], peers.Checkpointed)
    assert not isinstance(model.hf.decoder.block[0], peers.Checkpointed)
    remat.compile(model, budget_gb=None, compiler="eager")(*inputs).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-4, msg=name)
