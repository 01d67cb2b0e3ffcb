"""Compiled programs reused across processes: AOTAutograd's cache, keyed on remat's plan.

A warm ``torch.compile`` loads each graph's forward and backward programs from AOTAutograd's
cache: no joint trace, no partitioner, no Inductor. That cache keys on the dynamo graph, its
inputs and the settings, not on the saved set a partitioner chose, so a hit made under
another plan would run that plan's program; remat kept the cache off and a warm compile
traced and partitioned again (2 to 3.3x a warm ``torch.compile``'s first step on the CPU).

Here the cache is on, and its key names the plan:

- while the fitting loop compiles, each compile makes its AOTAutograd cache entry, kept
  unwritten (``torch_adapter.recording_program_entries``); once a plan is accepted, its entry
  is written under a key that holds the plan's digest (``torch_adapter.store_program_entry``,
  the key ``torch_adapter.program_cache`` looks up). Where no entry was made (a cache bypass)
  the plan is compiled once more with the cache on, which costs a trace and a partition
  (Inductor's programs come from its FX graph cache). The plan is stored in remat's plan
  cache under what is known before anything is traced: the dynamo graph, its inputs, the
  request, grad mode and autocast (:func:`program_key`);
- a later compile of the same graph and request reads that plan and asks AOTAutograd's cache
  for its program. On a hit nothing is traced, profiled, solved or compiled, and the report
  comes from the stored plan (torch's min-cut figures, which need the joint graph, are not
  known). On a miss (the entry evicted) the partitioner is reached, the compile stops there
  and remat plans as without this cache (one trace lost).

Another budget or request is another entry of the plan cache; another plan is another key of
AOTAutograd's: a program is never loaded for a plan it was not compiled for. Off where the
plan cache is off, under torch.distributed with more than one rank, and where AOTAutograd's
cache is off (``torch.compiler.config.force_disable_caches``, ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from . import plan_cache

from ..scope import ranks
from .. import torch_adapter as adapter
from ..capture.values import describe_value
from ..decide.attempt import Attempt, CompileStopped, GraphSetting, compile_attempt
from ..decide.graph_plan import GraphPlan
from ..decide.partition import Planner

log = logging.getLogger(__name__)

Compile = Callable[..., Callable[..., Any]]


def usable(planner: Planner, setting: GraphSetting, example_inputs: Sequence[Any]) -> bool:
    """Whether programs may be loaded and published for this graph of ``planner``'s (call it
    before remat's compile begins: that turns AOTAutograd's cache off). Not for symbolic
    sizes: remat pins them when it plans (``adapter.specialize_sizes``), which a program
    loaded whole would skip."""
    process_only = setting.scope is None or setting.scope.process  # (a rank's scope waits for every rank)
    return (planner.disk is not None and planner.request.compiler == "inductor" and process_only
            and ranks.world()[1] == 1 and all(map(_static, example_inputs))
            and adapter.program_cache_usable())


def _static(value: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    if isinstance(value, torch.Tensor):
        return not any(isinstance(n, torch.SymInt) for n in (*value.shape, *value.stride()))
    return True


def program_key(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner,
                setting: GraphSetting) -> dict[str, Any]:
    """What a plan depends on, known before the joint graph is traced."""
    autocast = [(d, torch.get_autocast_dtype(d).__repr__()) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    key = {"format": plan_cache.FORMAT, "program": plan_cache.graph_fingerprint(gm.graph),
            "inputs": describe_value(list(example_inputs)),
            "requires_grad": [getattr(x, "requires_grad", None) for x in example_inputs],
            **plan_cache.request_key(planner.request),
            "grad": torch.is_grad_enabled(), "autocast": autocast, "unread_state_bytes": setting.unread_state,
            "scope": None if setting.scope is None else setting.scope.key(),
            "torch": torch.__version__, "remat": plan_cache.remat_version()}
    return json.loads(json.dumps(key))  # as a stored key reads back (tuples as lists)


def plan_digest(cached: plan_cache.CachedPlan) -> str:
    """What distinguishes one plan's program from another's for the same graph."""
    decision = {"format": plan_cache.FORMAT, "saved": sorted(cached.saved), "recomputed": sorted(cached.recomputed),
                "random": sorted(cached.random)}
    return hashlib.sha256(json.dumps(decision, sort_keys=True).encode()).hexdigest()[:32]


def load(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, setting: GraphSetting,
         compile_graph: Compile, key: dict[str, Any]) -> tuple[Callable[..., Any], GraphPlan] | None:
    """The compiled graph loaded whole for the plan stored under its program ``key``, and that
    plan; or None (no plan stored, or AOTAutograd's cache lacks its program)."""
    assert planner.disk is not None
    cached = planner.disk.load(key, None)
    if cached is None or cached.compiled_peak is None:
        return None
    t0 = time.perf_counter()
    attempt = Attempt(setting, expect_program=True)
    try:
        compiled = compile_attempt(copy.deepcopy(gm), example_inputs, planner, attempt, compile_graph,
                                   within=adapter.program_cache(plan_digest(cached)))
    except CompileStopped:
        if attempt.stopped != "program miss":
            raise
        log.info("remat: AOTAutograd's cache lacks the stored plan's program; planning the graph again")
        return None
    return compiled, planner.loaded_plan(cached, time.perf_counter() - t0, setting.scope)


def publish(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, setting: GraphSetting,
            compile_graph: Compile, compiled: Callable[..., Any], plan: GraphPlan,
            key: dict[str, Any]) -> tuple[Callable[..., Any], GraphPlan]:
    """Put the program of the graph's accepted ``plan`` (compiled as ``compiled``)
    in AOTAutograd's cache under the plan's digest, and store the plan under the graph's program
    ``key``; the callable to run, and the plan with the time it took. The entry its compile recorded
    is written as it is; without one (a cache bypass), the plan is compiled once more with the cache on."""
    assert planner.disk is not None
    cached = plan_cache.entry_of(plan)
    t0 = time.perf_counter()
    if plan.program_entry is not None:
        adapter.store_program_entry(plan.program_entry, plan_digest(cached))
    else:
        compiled = compile_again(gm, example_inputs, planner, setting, compile_graph, plan, plan_digest(cached))
    planner.disk.store(key, cached)
    # (the entry written, the compiled code it refers to need not stay alive with the plan)
    return compiled, plan.revised(program_entry=None).timed("program cache", time.perf_counter() - t0)


def compile_again(gm: fx.GraphModule, example_inputs: Sequence[Any], planner: Planner, setting: GraphSetting,
                  compile_graph: Compile, plan: GraphPlan, digest: str) -> Callable[..., Any]:
    """Compile ``plan`` once more (handed out again, nothing planned), AOTAutograd's cache on under
    ``digest``."""
    attempt = Attempt(setting, replay=plan)
    return compile_attempt(copy.deepcopy(gm), example_inputs, planner, attempt, compile_graph,
                           within=adapter.program_cache(digest))
