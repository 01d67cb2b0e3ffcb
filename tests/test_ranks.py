"""Two CPU ranks (gloo, 127.0.0.1): one plan for every rank, one error on every rank.

The ranks run ``tests/rank_worker.py`` once for the module (each scenario in order);
measured op times are distorted differently on each rank, so agreement is not luck.
A launch that does not finish in time fails the tests instead of hanging them.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from bench.fsdp import free_port

REPO = pathlib.Path(__file__).resolve().parent.parent
WORLD = 2
LAUNCH_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("ranks")
    port = free_port()
    env = {**os.environ, "REMAT_RANK_TIMEOUT_S": "300", "REMAT_COST_CACHE": "off"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.rank_worker", str(r), str(WORLD), str(port), str(out)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=LAUNCH_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        tails = "\n".join(f"rank {r}:\n{p.communicate()[0][-3000:]}" for r, p in enumerate(procs))
        pytest.fail(f"the {WORLD} ranks did not finish in {LAUNCH_TIMEOUT_S} s (a hang)\n{tails}")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log[-4000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_ranks_left_alone_choose_differently(ranks: list[dict]) -> None:
    """The distortion bites: without agreement the ranks' saved sets differ (at one budget at least:
    a budget may leave a single good plan whatever the costs)."""
    mine, theirs = (r["alone"] for r in ranks)
    assert all(plan["recomputed"] for plan in (*mine.values(), *theirs.values()))
    assert any((mine[b]["saved"], mine[b]["recomputed"]) != (theirs[b]["saved"], theirs[b]["recomputed"]) for b in mine)


def test_every_rank_compiles_rank_0s_plan(ranks: list[dict]) -> None:
    first, second = (r["agreed"] for r in ranks)
    assert first["recomputed"] and (first["saved"], first["recomputed"]) == (second["saved"], second["recomputed"])
    assert (first["rank"], second["rank"], first["world_size"], second["world_size"]) == (0, 1, 2, 2)
    assert second["plan_cache"] == "rank 0" and any("decided by rank 0 of 2" in n for n in second["notes"])
    assert first["solves"] >= 1 and second["solves"] == 0  # rank 1 solved nothing


def test_a_budget_error_is_raised_on_every_rank(ranks: list[dict]) -> None:
    first, second = (r["budget_error"] for r in ranks)
    assert first["error"] == second["error"] == "BudgetError"
    assert first["message"] == second["message"] and first["min_feasible_bytes"] == second["min_feasible_bytes"]


def test_ranks_with_different_graphs_plan_their_own_and_warn(ranks: list[dict]) -> None:
    for rank, result in enumerate(r["different_graphs"] for r in ranks):
        assert result["warnings"], f"rank {rank} did not warn"
        assert result["plan_cache"] != "rank 0" and result["rank"] == rank


def test_an_all_gather_tagged_must_recompute_is_recomputed_on_every_rank(ranks: list[dict]) -> None:
    """SimpleFSDP style: the user's tag on an in-graph collective is honoured, as torch does;
    an untagged one is never recomputed (tests/test_policies.py)."""
    for result in (r["tagged_collective"] for r in ranks):
        assert result["grads_match"]
        assert set(result["collectives_recomputed"]) == {"_c10d_functional.all_gather_into_tensor.default",
                                                        "_c10d_functional.wait_tensor.default"}


def test_fullgraph_on_an_fsdp2_model_says_to_compile_each_block(ranks: list[dict]) -> None:
    for result in (r["fsdp_fullgraph"] for r in ranks):
        assert result["error"] == "GraphError" and "Compile each block" in result["message"]


def test_ddp_with_tiny_buckets_is_explained(ranks: list[dict]) -> None:
    for result in (r["ddp_tiny_buckets"] for r in ranks):
        assert result["error"] == "GraphError" and "Raise bucket_cap_mb" in result["message"]


@pytest.mark.parametrize("wrapping", ["fsdp_compile_then_shard", "fsdp_shard_then_compile", "ddp"])
def test_fsdp2_per_block_and_ddp_train_with_one_plan_and_eager_gradients(ranks: list[dict], wrapping: str) -> None:
    first, second = (r[wrapping] for r in ranks)
    assert first["grads_match"] and second["grads_match"]
    assert first["graphs"] and len(first["graphs"]) == len(second["graphs"])
    for mine, theirs in zip(first["graphs"], second["graphs"]):
        assert (mine["saved"], mine["recomputed"]) == (theirs["saved"], theirs["recomputed"])
        assert theirs["plan_cache"] == "rank 0" and (mine["world_size"], theirs["world_size"]) == (2, 2)
    if wrapping.startswith("fsdp"):  # at a binding budget
        assert any(g["recomputed"] for g in first["graphs"])


def test_ddp_bucket_split_graphs_under_a_budget_are_refused_and_one_graph_is_planned(ranks: list[dict]) -> None:
    for result in (r["ddp_budget"] for r in ranks):
        assert result["split"]["error"] == "GraphError" and "optimize_ddp = False" in result["split"]["message"]
        assert "While executing" not in result["split"]["message"]  # remat's message, not torch.fx's note
        assert result["graphs"] == 1 and result["grads_match"]
        # the budget is the rank's: DDP's gradient buckets, a copy of every gradient, are counted
        assert result["budget_scope"] == "rank" and result["resident_bytes"] == result["parameter_bytes"]


def test_inductor_compiles_one_plan_with_eager_gradients(ranks: list[dict]) -> None:
    first, second = (r["inductor"] for r in ranks)
    assert first["grads_match"] and second["grads_match"]
    assert first["recomputed"] and (first["saved"], first["recomputed"]) == (second["saved"], second["recomputed"])
    assert first["compiled_peak_bytes"] == second["compiled_peak_bytes"]


def test_a_torchrun_launch_plans_once_for_both_ranks() -> None:
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    run = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", str(WORLD), "-m", "tests.torchrun_worker"],
                         cwd=REPO, env={**os.environ, "REMAT_RANK_TIMEOUT_S": "300", "REMAT_COST_CACHE": "off"},
                         capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    by_rank = {line["rank"]: line for line in lines}
    assert set(by_rank) == {0, 1} and by_rank[1]["plan_cache"] == "rank 0"
    assert (by_rank[0]["saved"], by_rank[0]["recomputed"]) == (by_rank[1]["saved"], by_rank[1]["recomputed"])


def test_a_per_rank_budget_holds_as_measured_under_fsdp2_and_a_per_graph_one_does_not(ranks: list[dict]) -> None:
    """4 blocks compiled per block under FSDP2 at a budget a quarter of the way from the rank's smallest feasible to
    store-all: with the default scope (the rank's) every rank's measured step peak, local shards counted,
    is within it; with budget_scope="graph" the same budget is exceeded (each block graph gets all of it)."""
    for rank, result in enumerate(r["fsdp_rank_budget"] for r in ranks):
        budget, scoped, per_graph = result["budget_bytes"], result["auto"], result["graph"]
        assert result["scope_unbudgeted"] == scoped["budget_scope"] == "rank" and per_graph["budget_scope"] == "graph"
        assert scoped["kept_copies"] == 3 and scoped["resident_bytes"] > 0 and scoped["comm_bytes"] > 0
        assert scoped["graphs"] == 1  # the four blocks share one graph and one plan
        assert scoped["recomputed"], "the budget must bind"
        assert scoped["measured"] <= scoped["predicted"] <= budget, f"rank {rank}: {scoped} over {budget}"
        assert per_graph["measured"] > budget, f"rank {rank}: the per-graph budget held ({per_graph})"
    first, second = (r["fsdp_rank_budget"]["auto"] for r in ranks)
    assert (first["saved"], first["recomputed"]) == (second["saved"], second["recomputed"])


def test_the_eager_head_and_loss_are_reserved_from_the_heads_width_and_every_step_fits(ranks: list[dict]) -> None:
    """FSDP2 per-block compile with the head and loss run eagerly: before the first step they are reserved
    (three times the blocks' outputs, as wide as the head's vocabulary makes them), so each rank's first
    step is within the budget; measured on it, the bytes every rank agreed on are counted from the second,
    which keeps the plan (no second compile)."""
    for rank, result in enumerate(r["fsdp_eager_parts"] for r in ranks):
        budget, run = result["budget_bytes"], result["reserved"]
        first, later = run["first"], run["later"]
        assert first["reserved"] and first["eager_bytes"] >= later["eager_bytes"] > 0, f"rank {rank}: {run}"
        assert first["measured"] <= first["predicted"] <= budget, f"rank {rank}: {first} over {budget}"
        assert later["measured"] <= later["predicted"] <= budget, f"rank {rank}: {later} over {budget}"
        assert (later["saved"], later["recomputed"]) == (first["saved"], first["recomputed"]) and later["recomputed"]
        assert any("eager" in note for note in later["notes"])
        assert run["graphs"] == 1 and run["grads_match"]
    first, second = (r["fsdp_eager_parts"]["reserved"]["later"] for r in ranks)
    assert (first["saved"], first["recomputed"], first["eager_bytes"]) == (second["saved"], second["recomputed"],
                                                                           second["eager_bytes"])


def test_an_eager_head_the_reservation_misses_is_measured_on_the_first_step_and_counted_from_the_second(
        ranks: list[dict]) -> None:
    """A head no linear layer of the module tree shows (a tied embedding applied with F.linear) is reserved
    only as wide as the blocks' outputs: the first plan is over the budget once the measured head and loss
    are counted, and the second step's plan, made again with the bytes every rank agreed on, is within it."""
    for rank, result in enumerate(r["fsdp_eager_parts"] for r in ranks):
        budget, run = result["budget_bytes"], result["unseen"]
        first, later = run["first"], run["later"]
        eager = later["eager_bytes"]
        assert 0 < first["eager_bytes"] < eager, f"rank {rank}: {run}"
        assert first["predicted"] <= budget < first["predicted"] - first["eager_bytes"] + eager, f"rank {rank}: {run}"
        assert later["recomputed"] and len(later["recomputed"]) > len(first["recomputed"])
        assert later["measured"] <= later["predicted"] <= budget, f"rank {rank}: {later} over {budget}"
        assert run["graphs"] == 1
    first, second = (r["fsdp_eager_parts"]["unseen"]["later"] for r in ranks)
    assert (first["saved"], first["recomputed"], first["eager_bytes"]) == (second["saved"], second["recomputed"],
                                                                           second["eager_bytes"])


def test_blocks_compiled_again_in_the_process_count_the_measured_eager_parts_from_their_first_step(
        ranks: list[dict]) -> None:
    """The step object remembers the window every rank agreed on after a graph, as in a single process: the
    same blocks compiled again plan with it from the start (not a reservation), and every step is within
    the budget."""
    for rank, result in enumerate(r["fsdp_eager_parts"] for r in ranks):
        budget, measured, again = result["budget_bytes"], result["unseen"]["later"], result["again"]
        first, later = again["first"], again["later"]
        assert not first["reserved"] and first["eager_bytes"] == measured["eager_bytes"] > 0, f"rank {rank}: {again}"
        assert again["graphs"] == 1  # planned once: the first plan fits with the window counted
        assert max(first["measured"], later["measured"]) <= first["predicted"] <= budget, f"rank {rank}: {again}"


def test_a_caller_profiling_fsdp2_steps_exports_its_traces_and_the_eager_parts_wait_for_an_unprofiled_step(
        ranks: list[dict]) -> None:
    """The caller profiles the first two steps of an FSDP2 model whose blocks are compiled with
    backend="remat" (remat's own profiler once stopped the caller's there and both ranks crashed in
    ``export_chrome_trace``): every trace holds the caller's ops and memory events, and the eager head
    and loss, deferred while the caller profiled, are measured on the third step and counted."""
    for rank, result in enumerate(r["fsdp_profiled"] for r in ranks):
        assert len(result["traces"]) == 2
        for trace in result["traces"]:
            assert trace["caller_mark"] and trace["memory_events"] > 0, f"rank {rank}: {trace}"
        assert result["eager_bytes"] > 0, f"rank {rank}: {result}"
        assert any("deferred" in note for note in result["notes"]), result["notes"]
