"""Pieces of the benchmark: peers, the Pareto rows' bookkeeping, target checks, Hugging Face models and the
compile-time harness's pure parts (no compile runs here)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from bench import compile_time, hf_models, pareto, peers, render
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


def test_matched_rows_compare_remat_with_the_peers_rule_in_the_model() -> None:
    rules = {"checkpoint-blocks": {"peak_bytes": 48, "overhead_seconds": 0.004},
             "torch-min-cut": {"peak_bytes": 120, "overhead_seconds": 0.0}}
    rows = [
        _row("compile default", "peer", 100, 10.0),
        _row("compile checkpoint per block", "peer", 50, 12.0),
        _row("remat at compile default peak", "remat-matched", 99, 9.5, budget_bytes=100,
             matched_peer="compile default", extra={"peer_rules": rules, "predicted_overhead_ms": 1.0}),
        _row("remat at compile checkpoint per block peak", "remat-matched", 49, 10.4, budget_bytes=50,
             matched_peer="compile checkpoint per block", extra={"peer_rules": rules, "predicted_overhead_ms": 3.0}),
    ]
    default, block = render.matched(rows)
    assert (default["remat_model_ms"], default["rule_model_ms"], default["rule_fits"]) == (1.0, 0.0, False)
    assert (block["remat_model_ms"], block["rule_model_ms"], block["rule_fits"]) == (3.0, 4.0, True)
    assert "3.000, 4.000 (fits)" in render.matched_table(rows) and "1.000, 0.000 (over)" in render.matched_table(rows)
    check = next(c for c in render.targets("gpt", rows, sdpa=False) if "rule in remat's model" in c["target"])
    assert check["met"] and check["value"] == "1/1 no slower"  # min-cut's plan peaks over its budget: not counted
    rows[3]["extra"]["predicted_overhead_ms"] = 5.0
    check = next(c for c in render.targets("gpt", rows, sdpa=False) if "rule in remat's model" in c["target"])
    assert not check["met"] and "compile checkpoint per block" in check["value"]


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


def _outcome(seconds: float | None, status: str = "ok", **extra: object) -> dict:
    return {"status": status, "seconds": seconds, **extra}


def _compile_time_row(torch_s: dict, remat_s: dict) -> dict:
    runs = {"torch": {p: compile_time.combine([_outcome(torch_s[p])]) for p in compile_time.PHASES},
            "remat": {"cold": compile_time.combine([_outcome(remat_s["cold"], plan_cache="stored")]),
                      "warm": compile_time.combine([_outcome(remat_s["warm"], plan_cache="hit")])}}
    return compile_time.model_row("gpt-2", {"layers": 2}, 0.0123, runs)


def test_compile_time_ratios_and_verdicts() -> None:
    row = _compile_time_row({"cold": 10.0, "warm": 4.0}, {"cold": 14.0, "warm": 5.0})
    assert row["ratio"] == {"cold": 1.4, "warm": 1.25}
    assert row["verdict"] == {"cold": "meets", "warm": "misses"}
    assert compile_time.verdict(1.5, 1.5) == "meets" and compile_time.verdict(None, 1.5) == "n/a"
    assert compile_time.ratio(_outcome(None, "timeout"), _outcome(3.0)) is None


def test_compile_time_median_of_repeats_and_a_failed_repeat() -> None:
    runs = [_outcome(3.0, plan_cache="hit"), _outcome(1.0, plan_cache="hit"), _outcome(2.0, plan_cache="stored")]
    summary = compile_time.combine(runs)
    assert summary["seconds"] == 2.0 and summary["status"] == "ok" and summary["plan_cache"] == "hit/stored"
    assert "plan_cache" not in compile_time.combine([_outcome(1.0)])  # torch's runs have none
    failed = compile_time.combine([_outcome(1.0), _outcome(None, "timeout", timeout_s=5)])
    assert failed["status"] == "timeout" and failed["seconds"] is None


def test_compile_time_markdown_from_a_fake_result() -> None:
    rows = [_compile_time_row({"cold": 10.0, "warm": 4.0}, {"cold": 14.0, "warm": 5.0})]
    rows[0]["remat"]["cold"] = compile_time.combine([_outcome(None, "timeout", timeout_s=900)])
    rows[0]["ratio"]["cold"], rows[0]["verdict"]["cold"] = None, "n/a"
    meta = {"date": "2026-12-01", "command": "python -m bench.compile_time --models gpt-2", "torch": "2.13.0",
            "python": "3.11.7", "cpu": "x86_64, 2 cores", "threads": 2, "repeats": 1, "timeout_s": 900.0}
    text = compile_time.markdown(meta, rows)
    assert "Command: `python -m bench.compile_time --models gpt-2`" in text and "x86_64, 2 cores" in text
    assert "| gpt-2 | 10.0 | timeout |  | 4.0 | 5.0 | 1.25 (misses) | hit |" in text
    assert "- gpt-2: `{\"layers\": 2}`, budget 0.0123 GiB" in text


def test_compile_time_worker_timeout_error_and_result(tmp_path) -> None:
    env, private = {}, {str(tmp_path): "<tmp>"}
    slow = compile_time.run_command([sys.executable, "-c", "import time; time.sleep(30)"], env, 0.5, private)
    assert slow == {"status": "timeout", "seconds": None, "timeout_s": 0.5}
    crash = f"raise SystemExit('no cache in {tmp_path}/inductor')"
    failed = compile_time.run_command([sys.executable, "-c", crash], env, 30, private)
    assert failed == {"status": "error", "seconds": None, "error": "no cache in <tmp>/inductor"}
    ok = compile_time.run_command([sys.executable, "-c", "print('noise'); print('{\"seconds\": 1.5}')"], env, 30, {})
    assert ok == {"status": "ok", "seconds": 1.5}


def test_compile_time_command_line_models_and_caches(tmp_path) -> None:
    assert compile_time.command_line([]) == "python -m bench.compile_time"
    assert (compile_time.command_line(["--models", "demo", "gpt-2", "--out", "my results"])
            == "python -m bench.compile_time --models demo gpt-2 --out 'my results'")
    assert compile_time.default_models([2, 12]) == ["demo", "gpt-2", "gpt-12"]
    assert compile_time.model_size("gpt-12") == ("gpt", {"layers": 12, **compile_time.GPT_SIZE})
    assert compile_time.model_size("demo")[0] == "gpt"
    model, size = compile_time.model_size("hf-t5")  # a bench model at python -m bench's CPU size
    assert model == "hf-t5" and size["layers"] == 2
    with pytest.raises(ValueError, match="unknown model"):
        compile_time.model_size("llama-2")
    env = compile_time.cache_env(tmp_path)
    assert set(env) == {"TORCHINDUCTOR_CACHE_DIR", "REMAT_PLAN_CACHE", "REMAT_COST_CACHE"}
    assert len({*env.values()}) == 3 and all(v.startswith(str(tmp_path)) for v in env.values())


def test_monotone_bench_judges_rows_from_the_highest_budget_down() -> None:
    from bench.monotone import judged, verdict

    def row(budget, peak, ms, measured):
        return {"budget_bytes": budget, "predicted_peak_bytes": peak, "predicted_overhead_seconds": ms / 1e3,
                "measured_peak_bytes": measured}

    good = judged([row(100, 90, 1.0, 90), row(80, 75, 2.0, 80), row(60, 60, 3.0, 60)])
    assert all(verdict(good).values())
    assert [r["measured_rise"] for r in good] == [None, round(80 / 90 - 1, 4), round(60 / 80 - 1, 4)]
    bad = judged([row(100, 90, 1.0, 70), row(80, 95, 0.5, 75), row(60, 60, 3.0, 61)])
    assert verdict(bad) == {"predicted monotone": False, "measured rises at most 2%": False,
                            "measured within budget": False}
    # under Inductor the compiled program's peak is the one checked, not the model's
    compiled = judged([dict(row(100, 90, 1.0, 90), compiled_peak_bytes=88), dict(row(80, 95, 2.0, 80), compiled_peak_bytes=80)])
    assert verdict(compiled)["predicted monotone"]
    assert not verdict(judged([dict(row(100, 90, 1.0, 90), compiled_peak_bytes=70),
                               dict(row(80, 75, 2.0, 80), compiled_peak_bytes=80)]))["predicted monotone"]


def test_fused_order_bench_plans_without_the_rules_then_with_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import fused_order
    from remat.passes import torch_adapter as adapter
    from remat.passes.torch_adapter.inductor_order import FusedAtLastPart, LocalFusion

    installed: list[tuple[list[object], object]] = []

    def fake_planned(model: object, inputs: tuple) -> dict:
        installed.append(([adapter.INDUCTOR_SETTINGS.get(s) for s in fused_order.order_settings()],
                          adapter.INDUCTOR_CHOICES))
        low = 100 - 10 * len(installed)
        return {"min_feasible_bytes": low * 2**20, "no_budget_compiled_bytes": 0,
                **{f"at_{f}": {"budget_bytes": 0, "predicted_bytes": low * 2**20, "compiled_bytes": (low + i) * 2**20}
                   for i, f in enumerate(fused_order.FRACTIONS)}}

    monkeypatch.setattr(fused_order, "planned", fake_planned)
    monkeypatch.setattr(fused_order, "build", lambda name, device, size: (None, ()))
    before = dict(adapter.INDUCTOR_SETTINGS)
    row = fused_order.compare("gpt")
    assert adapter.INDUCTOR_SETTINGS == before and adapter.INDUCTOR_CHOICES is LocalFusion
    assert [choices for _, choices in installed] == [None, None, LocalFusion]
    if fused_order.order_settings():  # a torch with the hook: off for the first plan, remat's pass after
        assert installed[0][0] == [None] and all(isinstance(s[0], FusedAtLastPart) for s, _ in installed[1:])
    assert fused_order.lowest_compiled(row["inductor_order"]) == 90 * 2**20
    table = fused_order.markdown([row])
    assert "| gpt | inductor order | 90.00 | 90.00 |" in table and "| gpt | last part | 80.00 | 80.00 |" in table
    assert "| gpt | last part local fusion | 70.00 | 70.00 |" in table


def test_floor_bench_bound_is_below_every_plan_remat_accepts(tmp_path) -> None:
    """The proven floor of the plan space is at or below the min-peak plan it comes with and the
    smallest budget remat accepts (a bound above either would be a wrong proof), and the files say so."""
    from bench import floor
    from bench.models import SIZES

    row = floor.floor_of("gpt", 20.0, size=SIZES["smoke"]["gpt"], compiler="eager")
    assert row["status"] == "optimal" and row["gap"] <= 1e-6
    assert row["floor_bound_bytes"] <= row["floor_plan_bytes"] <= row["min_feasible_bytes"] < row["store_all_bytes"]
    floor.write(tmp_path, [row], "python -m bench.floor")
    text = next(tmp_path.glob("*-cpu-floor.md")).read_text()
    assert "| gpt |" in text and "optimal, 0.00%" in text
