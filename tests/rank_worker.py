"""One rank of the 2-rank CPU tests (tests/test_ranks.py): ``python -m tests.rank_worker RANK WORLD PORT OUT``.

Every rank runs the same scenarios in the same order and writes what it saw to
``OUT/rank<RANK>.json``. Measured op times are distorted differently on each rank
(a seeded factor per op), so ranks left alone would choose different saved sets.
"""

from __future__ import annotations

import copy
import datetime
import faulthandler
import functools
import json
import logging
import os
import pathlib
import random
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from bench import fsdp as fsdp_bench
import remat
from remat.errors import GIB
from remat.measure import cpu_step_peak
from remat.passes.decide import partition
from remat.passes.costs import profile
from remat.passes.scope import rank_scope
from remat.passes.scope.step import STEP
from tests.conftest import build

WORKER_LIMIT_S = 420
SCENARIOS = ("alone", "agreed", "budget_error", "different_graphs", "tagged_collective", "fsdp_fullgraph",
             "ddp_tiny_buckets", "fsdp_compile_then_shard", "fsdp_shard_then_compile", "ddp", "ddp_budget", "inductor",
             "fsdp_rank_budget", "fsdp_eager_parts", "fsdp_profiled")


def distort_times(rank: int) -> None:
    """Each op's measured time times a factor drawn per op, 0.1 to 10, on rank 0 and its inverse on
    the others: what is cheap to recompute on one rank is dear on the other."""
    measure = profile.time_call
    draws: dict[int, float] = {}

    def distorted(fn: Any, device: torch.device, *args: Any) -> float:
        factor = draws.setdefault(len(draws), random.Random(f"op-{len(draws)}").uniform(0.1, 10.0))
        return measure(fn, device, *args) * (factor if rank == 0 else 1 / factor)

    profile.time_call = distorted


def count_solves() -> list[int]:
    calls: list[int] = []
    solve = partition.solve
    partition.solve = lambda *a, **k: calls.append(1) or solve(*a, **k)
    return calls


def fresh() -> None:
    torch._dynamo.reset()
    profile.SHARED_TIMINGS.entries.clear()  # each scenario measures (and distorts) afresh
    STEP.forget_measured()  # and its own eager windows


def decision(report: remat.Report) -> dict[str, Any]:
    return {"saved": sorted(report.saved), "recomputed": sorted(report.recomputed), "plan_cache": report.plan_cache,
            "rank": report.rank, "world_size": report.world_size, "notes": list(report.notes)}


def budget_gb(model: torch.nn.Module, inputs: tuple, fraction: float, **options: Any) -> float:
    """Rank 0's budget ``fraction`` of the way from the smallest feasible to store-all, on every rank
    (each rank's figure is its own, computed when read)."""
    budget = [remat.plan(model, *inputs, **options).budget_at(fraction) / GIB]
    dist.broadcast_object_list(budget, src=0)
    return budget[0]


def alone() -> dict[str, Any]:
    """Agreement off: each rank's own (distorted) plans, at five binding budgets (at one budget two
    distorted profiles can still lead to one plan: a CI run under load saw it at two of them, and a
    quiet run at three), rank 0's, read from one plan with no budget."""
    os.environ["REMAT_RANK_AGREEMENT"] = "off"
    try:
        model, inputs = build("gpt", layers=1)
        fractions = (0.15, 0.3, 0.45, 0.6, 0.75)
        top = remat.plan(model, *inputs, compiler="eager")
        budgets = [[top.budget_at(fraction) / GIB for fraction in fractions]]
        dist.broadcast_object_list(budgets, src=0)
        return {str(fraction): decision(remat.plan(model, *inputs, budget_gb=budget, compiler="eager"))
                for fraction, budget in zip(fractions, budgets[0])}
    finally:
        del os.environ["REMAT_RANK_AGREEMENT"]


def agreed() -> dict[str, Any]:
    solves = count_solves()
    model, inputs = build("gpt", layers=1)
    budget = budget_gb(model, inputs, 0.5, compiler="eager")
    return {**decision(remat.plan(model, *inputs, budget_gb=budget, compiler="eager")), "solves": len(solves)}


def budget_error() -> dict[str, Any]:
    model, inputs = build("gpt", layers=1)
    try:
        remat.plan(model, *inputs, budget_gb=1e-6, compiler="eager")
    except remat.BudgetError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "min_feasible_bytes": exc.min_feasible_bytes}
    return {"error": None}


def different_graphs(rank: int) -> dict[str, Any]:
    model, inputs = build("gpt", layers=1, seq=32 + 16 * rank)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("remat").addHandler(handler)
    try:
        report = remat.plan(model, *inputs, compiler="eager")
    finally:
        logging.getLogger("remat").removeHandler(handler)
    return {**decision(report), "warnings": [r for r in records if "different graphs" in r]}


def recompute_collectives(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_RECOMPUTE if "c10d" in str(op) else CheckpointPolicy.PREFER_SAVE


class GatheredLinear(torch.nn.Module):
    """A SimpleFSDP-style layer: each rank holds half the weight's rows and all-gathers them in the
    graph, inside a selective checkpoint that tags the all-gather MUST_RECOMPUTE."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shard = torch.nn.Parameter(torch.randn(8, 16))

    def block(self, x: torch.Tensor) -> torch.Tensor:
        full = funcol.all_gather_tensor(self.shard, 0, dist.group.WORLD)
        return torch.relu(x @ full.T) @ full  # the backward needs the gathered weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = functools.partial(create_selective_checkpoint_contexts, recompute_collectives)
        return checkpoint(self.block, x, use_reentrant=False, context_fn=context).square().sum()


def tagged_collective() -> dict[str, Any]:
    model, x = GatheredLinear(), torch.randn(4, 16)
    reference = copy.deepcopy(model)
    compiled = remat.compile(model, compiler="eager")
    compiled(x).backward()
    reference(x).backward()
    (report,) = remat.reports(compiled)
    recomputed = [n.op for n in report.nodes if n.decision == "recomputed" and n.category == "collective"]
    return {**decision(report), "collectives_recomputed": recomputed,
            "grads_match": torch.allclose(model.shard.grad, reference.shard.grad)}


def error_of(run: Any) -> dict[str, Any]:
    try:
        run()
    except Exception as exc:  # what a user would see
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def fsdp_fullgraph() -> dict[str, Any]:
    model, inputs = build("gpt", layers=1, batch=2, seq=16)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return error_of(lambda: remat.compile(model, fullgraph=True, compiler="eager")(*inputs))


def ddp_tiny_buckets() -> dict[str, Any]:
    model, inputs = build("gpt", layers=2, batch=2, seq=16)
    wrapped = DistributedDataParallel(model, bucket_cap_mb=0.001)
    return error_of(lambda: remat.compile(wrapped, compiler="eager")(*inputs).backward())


def grads_match(model: torch.nn.Module, reference: torch.nn.Module) -> bool:
    return all(torch.allclose(fsdp_bench.local(p.grad), fsdp_bench.local(q.grad), rtol=1e-4, atol=1e-5)
               for p, q in zip(model.parameters(), reference.parameters(), strict=True))


def fsdp_blocks(order: str) -> dict[str, Any]:
    """FSDP2 with each block compiled with backend="remat" at a binding budget, in torchtitan's order
    (compile, then shard) or the other; against the same sharding run eagerly."""
    torch.manual_seed(0)
    model, inputs = build("gpt", layers=2, batch=2, seq=16)
    reference = copy.deepcopy(model)
    width = model.tok_emb.embedding_dim
    block_input = torch.randn(2, 16, width, requires_grad=True)
    budget = budget_gb(copy.deepcopy(model.blocks[0]), (block_input,), 0.5, compiler="eager")
    # the budget is one block graph's (budget_scope "graph"); fsdp_rank_budget tests the rank's
    per_graph = {"budget_gb": budget, "compiler": "eager", "budget_scope": "graph"}
    before = len(remat.reports())
    for net in (model, reference):
        for block in net.blocks:
            if net is model and order == "compile-then-shard":
                block.compile(backend="remat", options=per_graph)
            fully_shard(block)
            if net is model and order == "shard-then-compile":
                block.compile(backend="remat", options=per_graph)
        fully_shard(net)
    model(*inputs).backward()
    reference(*inputs).backward()
    reports = remat.reports()[before:]
    return {"graphs": [decision(r) for r in reports], "grads_match": grads_match(model, reference)}


def ddp() -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = build("gpt", layers=2, batch=2, seq=16)
    reference = DistributedDataParallel(copy.deepcopy(model))
    compiled = remat.compile(DistributedDataParallel(model), compiler="eager")
    compiled(*inputs).backward()
    reference(*inputs).backward()
    return {"graphs": [decision(r) for r in remat.reports(compiled)], "grads_match": grads_match(model, reference)}


def ddp_budget() -> dict[str, Any]:
    """Under a budget: DDP's bucket-split graphs are refused with what to do; one graph is planned."""
    torch.manual_seed(0)
    model, inputs = build("gpt", layers=2, d_model=256, batch=2, seq=16)  # about 3 MiB a block: several buckets
    reference = DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=1)
    split = error_of(lambda: remat.compile(DistributedDataParallel(model, bucket_cap_mb=1), budget_gb=1.0,
                                           compiler="eager")(*inputs))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(optimize_ddp=False):
        compiled = remat.compile(DistributedDataParallel(model, bucket_cap_mb=1), budget_gb=1.0, compiler="eager")
        compiled(*inputs).backward()
    reference(*inputs).backward()
    (report,) = remat.reports(compiled)
    return {"split": split, "graphs": 1, "grads_match": grads_match(model, reference),
            "budget_scope": report.budget_scope, "resident_bytes": report.resident_bytes,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def inductor() -> dict[str, Any]:
    """remat.compile under Inductor at a binding budget: one saved set, gradients as eager's."""
    torch.manual_seed(0)
    model, inputs = build("gpt", layers=1, batch=4, seq=32)
    reference = copy.deepcopy(model)
    budget = budget_gb(model, inputs, 0.3)
    compiled = remat.compile(model, budget_gb=budget)
    compiled(*inputs).backward()
    reference(*inputs).backward()
    close = all(torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)
                for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    (report,) = remat.reports(compiled)
    return {**decision(report), "grads_match": close, "compiled_peak_bytes": report.compiled_peak_bytes}


def sharded_blocks(base: torch.nn.Module, options: dict[str, Any]) -> torch.nn.Module:
    """A copy of ``base`` with each block compiled with backend="remat" and sharded, then the root."""
    return fsdp_bench.sharded(base, lambda block: block.compile(backend="remat", options=options))


def fsdp_rank_budget() -> dict[str, Any]:
    """FSDP2, 4 blocks compiled: a budget a quarter of the way from the rank's smallest feasible
    to its store-all peak (the eager head counted in both) holds per rank as measured with
    budget_scope "rank" (the default), and not with "graph", where each block graph gets the
    whole budget."""
    torch.manual_seed(0)
    base, inputs = build("gpt", layers=4, batch=4, seq=64)
    before = len(remat.reports())
    model = sharded_blocks(base, {"compiler": "eager"})
    for _ in range(2):  # the second step counts the eager head and loss in the report
        model(*inputs).backward()
    unbudgeted = remat.reports()[before]
    budget = [unbudgeted.budget_at(0.25)]
    dist.broadcast_object_list(budget, src=0)
    result: dict[str, Any] = {"budget_bytes": budget[0], "scope_unbudgeted": unbudgeted.budget_scope}
    for scope in ("auto", "graph"):
        before = len(remat.reports())
        model = sharded_blocks(base, {"compiler": "eager", "budget_gb": budget[0] / GIB, "budget_scope": scope})
        for _ in range(2):  # the second step counts the eager head and loss the first measured
            model(*inputs).backward()
        report = remat.reports()[before]
        result[scope] = {**decision(report), "measured": fsdp_bench.step_peaks(model, inputs)[0],
                         "predicted": report.predicted_peak_bytes, "budget_scope": report.budget_scope,
                         "kept_copies": report.kept_copies, "resident_bytes": report.resident_bytes,
                         "comm_bytes": report.comm_bytes, "graphs": len(remat.reports()) - before}
    return result


def budgeted_steps(base: torch.nn.Module, inputs: tuple, budget: int,
                   reference: torch.nn.Module | None = None) -> dict[str, Any]:
    """``base``'s blocks compiled under ``budget`` and sharded: the first step's plan and measured peak,
    the plan of the steps after it (counting what the first measured) and theirs."""
    before = len(remat.reports())
    model = sharded_blocks(base, {"compiler": "eager", "budget_gb": budget / GIB})
    first_peak = cpu_step_peak(lambda: model(*inputs).backward()) + fsdp_bench.shard_bytes(model)
    first = remat.reports()[before]
    first_plan = {**decision(first), "predicted": first.predicted_peak_bytes, "eager_bytes": first.eager_bytes,
                  "reserved": first.eager_reserved, "measured": first_peak}
    model.zero_grad(set_to_none=True)
    model(*inputs).backward()  # with the plan that counts them
    grads = True
    if reference is not None:
        reference(*inputs).backward()
        grads = grads_match(model, reference)
    report = remat.reports()[before]
    later = {**decision(report), "predicted": report.predicted_peak_bytes, "eager_bytes": report.eager_bytes,
             "measured": fsdp_bench.step_peaks(model, inputs)[0], "notes": report.notes}
    return {"first": first_plan, "later": later, "graphs": len(remat.reports()) - before, "grads_match": grads}


def fsdp_eager_parts() -> dict[str, Any]:
    """FSDP2, 4 blocks compiled, the embedding, head (a 4096-word vocabulary) and loss run eagerly. The
    budget lies half way between the rank's smallest feasible and store-all peaks with them counted.
    Before the first step they are reserved from the head's width; measured on it and counted from the
    second. A head the module tree does not show is not reserved: the first plan is over the budget
    once they are counted, and the second step's is planned again."""
    torch.manual_seed(0)
    base, inputs = build("gpt", layers=4, batch=4, seq=64, vocab=4096)
    before = len(remat.reports())
    generous = sharded_blocks(base, {"compiler": "eager", "budget_gb": 1.0})
    for _ in range(2):  # the second step counts what the first measured
        generous(*inputs).backward()
    counted = remat.reports()[before]
    budget = [(counted.min_feasible_bytes + counted.store_all_peak_bytes) // 2]
    dist.broadcast_object_list(budget, src=0)
    reference = fsdp_bench.sharded(base, None)  # (before the model: sharding resets dynamo)
    STEP.forget_measured()  # the window is measured anew on this model's first step
    result = {"budget_bytes": budget[0], "reserved": budgeted_steps(base, inputs, budget[0], reference)}
    STEP.forget_measured()
    widening = rank_scope.head_widening
    rank_scope.head_widening = lambda compiled, root: 1.0  # a head no linear layer shows (a tied F.linear)
    try:
        result["unseen"] = budgeted_steps(base, inputs, budget[0])
    finally:
        rank_scope.head_widening = widening
    # the blocks compiled again in this process: their first plan counts the window measured above
    result["again"] = budgeted_steps(base, inputs, budget[0])
    return result


def fsdp_profiled(rank: int, out: str) -> dict[str, Any]:
    """FSDP2, blocks compiled with backend="remat": the caller profiles the first two steps (the first
    compiles and would measure the eager head and loss) and exports each trace; the eager parts are
    measured on the third step, the first without the caller's profiler, and counted from the fourth."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from tests.profiler_worker import CALLER_MARK, trace_facts

    torch.manual_seed(0)
    base, inputs = build("gpt", layers=2, batch=4, seq=64, vocab=1024)
    before = len(remat.reports())
    model = sharded_blocks(base, {"compiler": "eager"})
    traces = []
    for step in range(4):
        if step >= 2:
            model(*inputs).backward()
            continue
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with record_function(CALLER_MARK):
                model(*inputs).backward()
        path = os.path.join(out, f"profiled-rank{rank}-step{step}.json")
        prof.export_chrome_trace(path)
        traces.append(trace_facts(pathlib.Path(path)))
    report = remat.reports()[before]
    return {"traces": traces, "eager_bytes": report.eager_bytes, "notes": list(report.notes)}


def main(rank: int, world: int, port: int, out: str) -> None:
    faulthandler.dump_traceback_later(WORKER_LIMIT_S, exit=True)  # a hang shows where each rank waits
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    distort_times(rank)
    results: dict[str, Any] = {}
    runs = {"alone": alone, "agreed": agreed, "budget_error": budget_error,
            "different_graphs": functools.partial(different_graphs, rank), "tagged_collective": tagged_collective,
            "fsdp_fullgraph": fsdp_fullgraph, "ddp_tiny_buckets": ddp_tiny_buckets,
            "fsdp_compile_then_shard": functools.partial(fsdp_blocks, "compile-then-shard"),
            "fsdp_shard_then_compile": functools.partial(fsdp_blocks, "shard-then-compile"), "ddp": ddp, "ddp_budget": ddp_budget,
            "inductor": inductor, "fsdp_rank_budget": fsdp_rank_budget, "fsdp_eager_parts": fsdp_eager_parts,
            "fsdp_profiled": functools.partial(fsdp_profiled, rank, out)}
    for name in SCENARIOS:
        fresh()
        results[name] = runs[name]()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
