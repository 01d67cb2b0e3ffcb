"""Plans kept on disk, so recompiling a graph already planned skips the solve.

An entry is one JSON file (never pickle) named by the hash of its key: the
joint graph's structure with every value's shape, stride and dtype, the
options that shape the plan (budget, headroom, solver, profile, compiler,
time limit), the device, and the torch and remat versions. A file that does
not parse, holds another key, fails its checksum or names nodes the graph
lacks is ignored with a warning and replaced by the next plan made.

Where: ``plan_cache=`` of :class:`remat.Options` (``True``: the default
folder, a path: that folder, ``False``: off); the environment variable
``REMAT_PLAN_CACHE`` sets the default (``0``/``off`` or a folder). The
default folder is ``$XDG_CACHE_HOME/remat/plans`` (``~/.cache/remat/plans``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from remat.solvers.problem import Problem, problem_from_dict, problem_to_dict

from ..capture.values import describe_value
from ..decide.request import PlanRequest

log = logging.getLogger(__name__)

FORMAT = 10  # 10: a problem names the memory outside its graph, an analytic profile counts the scratch of Python kernels, Inductor's random prims hold none; 9: plans solved near the shared plan say how many decisions were fixed; 8: matmuls Inductor folds into an add placed there, or kept apart; 7: no scratch for ops Inductor
# generates code for, no horizontal fusion across an extern kernel
OFF = ("0", "off", "false", "no", "")


# The solution's own facts a later compile reports as they were (the rest is recomputed
# from the stored problem: peak, timeline, added time).
SOLUTION_FACTS = ("solver", "status", "bound", "gap", "solve_seconds", "notes", "shared_blocks", "fixed_decisions")


@dataclass(frozen=True)
class CachedPlan:
    """What a later compile of the same graph needs: the problem as profiled, the decision
    and the solve's facts, with the figures already computed. A hit profiles and solves
    nothing; a figure not stored is computed from the stored problem when read."""

    problem: Problem
    saved: frozenset[str]
    recomputed: frozenset[str]
    random: frozenset[str]
    target: int | None
    solution: dict[str, Any]  # SOLUTION_FACTS
    notes: tuple[str, ...] = ()
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the peak of the program Inductor generated for this plan: a later compile whose
    # program comes from Inductor's own cache (no code generated, nothing to account) uses it
    compiled_peak: int | None = None
    # bytes alive when that program's forward returns (its inputs and what it hands the backward)
    handoff: int | None = None


def entry_of(plan: Any) -> CachedPlan:
    """The cache entry for a ``GraphPlan`` (passes/decide/partition.py)."""
    solution = plan.solution
    facts = {name: getattr(solution, name) for name in SOLUTION_FACTS}
    facts["status"], facts["notes"] = solution.status.value, list(solution.notes)
    return CachedPlan(plan.problem, solution.saved, solution.recomputed, frozenset(plan.random_names), plan.target,
                      facts, tuple(plan.all_notes), plan.known(plan.deferred_fields()), plan.compiled_peak_bytes,
                      None if plan.program is None else plan.program.handoff_bytes)


def cache_dir(setting: bool | str | os.PathLike[str]) -> Path | None:
    """The folder plans live in under ``setting``, or None when caching is off."""
    if setting is False:
        return None
    if setting is not True:
        return Path(setting)
    env = os.environ.get("REMAT_PLAN_CACHE")
    if env is not None:
        return None if env.strip().lower() in OFF else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "remat" / "plans"


def graph_key(graph: fx.Graph, request: PlanRequest, device: str) -> dict[str, Any]:
    """Everything a plan depends on, as plain data."""
    return {"format": FORMAT, "graph": graph_fingerprint(graph), **request_key(request), "device": device,
            "torch": torch.__version__, "remat": remat_version()}


def request_key(request: PlanRequest) -> dict[str, Any]:
    """What of the request a plan depends on."""
    return {
        "budget_bytes": request.solve.budget_bytes,
        "headroom": request.solve.headroom,
        "solver": request.solve.solver,
        "profile": request.profile,
        "compiler": request.compiler,
        "time_limit_s": request.solve.time_limit_s,
        "policy": None if request.policy is None else request.policy.name,
        "budget_scope": request.budget_scope,
    }


def graph_fingerprint(graph: fx.Graph, *, by_position: bool = False) -> str:
    """A hash of the graph's ops, edges and every value's shape, stride and dtype.

    Nodes go by name (a plan names the nodes it keeps), or ``by_position``: equal on ranks
    that traced the same code whatever names their traces gave (``passes/scope/ranks.py``)."""
    label = {node: f"%{i}" if by_position else f"%{node.name}" for i, node in enumerate(graph.nodes)}
    digest = hashlib.sha256()
    for node in graph.nodes:
        args = fx.node.map_arg((node.args, node.kwargs), label.__getitem__)
        target = "" if node.op == "placeholder" else stable_name(node.target)  # a placeholder's target is its name
        value = node.meta.get("val", node.meta.get("example_value"))  # a joint graph's, or dynamo's
        digest.update(repr((label[node], node.op, target, args, describe_value(value))).encode())
    return digest.hexdigest()


def stable_name(target: Any) -> str:
    """A node's target by name, the same in every process (a Python function's repr holds its address)."""
    text = str(target)
    if " at 0x" not in text:
        return text
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__name__)}"


class PlanCache:
    """Load and store plans in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path_for(self, key: dict[str, Any]) -> Path:
        return self.folder / f"{_digest(key)[:32]}.json"

    def load(self, key: dict[str, Any], graph: fx.Graph | None) -> CachedPlan | None:
        """The plan stored under ``key``; with ``graph``, only if it names nodes ``graph`` has
        (None: a program-cache index entry, read before any joint graph exists)."""
        path = self.path_for(key)
        if not path.exists():
            return None
        try:
            entry = json.loads(path.read_text())
            plan = _entry_to_plan(entry, key)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("remat: ignoring plan cache file %s: %s", path, exc)
            return None
        missing = set() if graph is None else (plan.saved | plan.recomputed) - {n.name for n in graph.nodes}
        if missing:
            log.warning("remat: ignoring plan cache file %s: it names nodes the graph lacks %s", path, sorted(missing)[:3])
            return None
        return plan

    def store(self, key: dict[str, Any], plan: CachedPlan) -> bool:
        """Write ``plan`` under ``key``; False (and a warning) if the folder is not writable."""
        body = {"key": key, **record_of(plan)}
        entry = {**body, "checksum": _digest(body)}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.folder, suffix=".tmp", delete=False) as tmp:
                json.dump(entry, tmp)
            os.replace(tmp.name, self.path_for(key))  # atomic: readers never see half a file
        except OSError as exc:
            log.warning("remat: could not write the plan cache in %s: %s", self.folder, exc)
            return False
        return True


def _entry_to_plan(entry: dict[str, Any], key: dict[str, Any]) -> CachedPlan:
    body = {k: v for k, v in entry.items() if k != "checksum"}
    if entry.get("checksum") != _digest(body):
        raise ValueError("checksum mismatch (a damaged or edited file)")
    if entry["key"] != key:
        raise ValueError("made for another graph, budget, device or version")
    return plan_of_record(entry)


def record_of(plan: CachedPlan) -> dict[str, Any]:
    """``plan`` as JSON-able data: what a cache file holds besides its key and checksum (and what
    rank 0 sends the other ranks, ``passes/scope/ranks.py``)."""
    return {"saved": sorted(plan.saved), "recomputed": sorted(plan.recomputed), "random": sorted(plan.random),
            "target": plan.target, "solution": plan.solution, "notes": list(plan.notes), "figures": plan.figures,
            "compiled_peak": plan.compiled_peak, "handoff": plan.handoff, "problem": problem_to_dict(plan.problem)}


def plan_of_record(record: dict[str, Any]) -> CachedPlan:
    return CachedPlan(problem_from_dict(record["problem"]), frozenset(record["saved"]),
                      frozenset(record["recomputed"]), frozenset(record["random"]), record["target"],
                      dict(record["solution"]), tuple(record["notes"]), dict(record["figures"]),
                      record["compiled_peak"], record.get("handoff"))


def renamed_record(record: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """``record`` with every node name replaced by ``names[name]`` (another rank's names for the same graph)."""
    rename = names.__getitem__
    problem = record["problem"]
    values = [{**v, "name": rename(v["name"]), "operands": [rename(o) for o in v["operands"]],
               "keep_operands": [rename(o) for o in v["keep_operands"]]} for v in problem["values"]]
    problem = {**problem, "values": values, "step_names": [rename(n) for n in problem["step_names"]]}
    lists = {k: sorted(map(rename, record[k])) for k in ("saved", "recomputed", "random")}
    return {**record, **lists, "problem": problem}


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@functools.cache
def remat_version() -> str:
    """The version plus a hash of the sources a plan depends on (these passes and the
    solvers): an edited checkout plans anew."""
    try:
        version = importlib.metadata.version("remat")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "unknown"
    digest = hashlib.sha256()
    for path in plan_sources():
        digest.update(path.read_bytes())
    return f"{version}+{digest.hexdigest()[:12]}"


def plan_sources() -> list[Path]:
    """Every source of these passes (the torch adapter's fusion rules and program account
    included) and of the solvers."""
    import remat.solvers

    import remat.passes

    folders = (Path(remat.passes.__file__).parent, Path(remat.solvers.__file__).parent)
    return [path for folder in folders for path in sorted(folder.rglob("*.py"))]


def graph_device(graph: fx.Graph) -> str:
    """The device the graph's inputs live on, by model name for a GPU."""
    for node in graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if val.device.type == "cuda":
                return f"cuda:{torch.cuda.get_device_name(val.device)}"
            return val.device.type
    return "cpu"
