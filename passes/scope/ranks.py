"""One plan for every rank: rank 0 decides, the others take its decision.

Under ``torch.distributed`` with more than one rank every process compiles the same
graphs (SPMD code, DDP, FSDP2 per-block compiles), but measured op costs differ
between processes, so ranks left alone choose different saved sets; and an error
raised on one rank only leaves the others waiting in their next collective. So for
each graph dynamo captures the ranks first compare a fingerprint of it (its ops,
edges, shapes, dtypes, by position, not by name); if all agree, rank 0 plans and
compiles it as if alone (profile, solve, plan cache, the fitting loop under
Inductor) and then broadcasts the plan it compiled, or its error, and every other
rank compiles that plan as it is, or raises the same error. Only the backend's
compile of a graph exchanges anything: figures computed later, when a report is
read (on any rank, or on one only), are computed locally. Ranks whose graphs differ
each plan their own, with a warning; ``REMAT_RANK_AGREEMENT=off`` makes every rank
plan its own (for code whose ranks compile different graphs, or in another order).
The messages go over a gloo side group of remat's own with a timeout
(``REMAT_RANK_TIMEOUT_S``, default 900 s), so a rank that never arrives is an error
on the others, never a hang.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.fx as fx

from remat.solvers.errors import BudgetError, GraphError, PlanError

from ..cache import plan_cache
from .. import torch_adapter as adapter

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 900.0
_SIDE: list[tuple[Any, Any]] = []  # (the default group, remat's side group over it), the latest only


def timeout_s() -> float:
    raw = os.environ.get("REMAT_RANK_TIMEOUT_S")
    try:
        return DEFAULT_TIMEOUT_S if raw is None else float(raw)
    except ValueError:
        raise ValueError(f"REMAT_RANK_TIMEOUT_S must be a number of seconds, not {raw!r}") from None


def world() -> tuple[int, int]:
    """(rank, world size): (0, 1) outside ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def exchanging() -> bool:
    """Whether ranks exchange anything: more than one, and agreement not turned off."""
    return world()[1] > 1 and os.environ.get("REMAT_RANK_AGREEMENT", "on").strip().lower() not in plan_cache.OFF


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("remat: %s (see docs/distributed.md)", message)


def side_group() -> Any:
    """A gloo group over every rank, made once (every rank makes it at its first graph)."""
    default = dist.group.WORLD
    if not _SIDE or _SIDE[0][0] is not default:  # none yet, or the process group was made anew
        _SIDE[:] = [(default, dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s())))]
    return _SIDE[0][1]


@dataclass
class Agreement:
    """One graph's exchange between the ranks; ``None`` from :meth:`for_graph` when there is
    nothing to agree on (one rank, or graphs that differ)."""

    rank: int
    world_size: int
    group: Any

    @classmethod
    def for_graph(cls, graph: fx.Graph, request: Any) -> Agreement | None:
        """The exchange for ``graph`` planned under ``request`` (a ``PlanRequest``): ranks agree
        when both are the same on every rank."""
        if not exchanging():
            return None
        rank, size = world()
        group = side_group()
        prints: list[Any] = [None] * size
        mine = json.dumps([plan_cache.graph_fingerprint(graph, by_position=True), plan_cache.request_key(request)],
                          sort_keys=True)
        exchange(lambda: dist.all_gather_object(prints, mine, group=group), rank)
        if len(set(prints)) > 1:
            log.warning("remat: the ranks compiled different graphs, or under different options (seen on rank %d): "
                        "each rank plans its own, and their saved sets may differ", rank)
            return None
        return cls(rank, size, group)

    @property
    def decides(self) -> bool:
        return self.rank == 0

    def send(self, record: dict[str, Any] | None, names: list[str]) -> None:
        """Rank 0: the plan record every rank compiles (``names``: its joint graph's nodes in
        order), or None when rank 0 planned nothing (an inference graph)."""
        self._broadcast({"plan": record, "names": names})

    def send_error(self, exc: BaseException) -> None:
        """Rank 0: planning failed; every rank raises the same error."""
        self._broadcast({"error": error_record(exc)})

    def receive(self) -> tuple[dict[str, Any], list[str]] | None:
        """A rank other than 0: rank 0's plan record and node names (None: no plan); rank 0's error raised."""
        message = self._broadcast(None)
        if "error" in message:
            raise error_of(message["error"])
        return None if message["plan"] is None else (message["plan"], message["names"])

    def _broadcast(self, message: dict[str, Any] | None) -> dict[str, Any]:
        box = [message]
        exchange(lambda: dist.broadcast_object_list(box, src=0, group=self.group), self.rank)
        return box[0]


def largest_on_any_rank(values: list[int]) -> list[int]:
    """Each of ``values`` at its largest over the ranks (every rank calls this at the same point of
    its step); ``values`` as they are on one rank, or where the ranks plan alone."""
    if not exchanging():
        return values
    rank, size = world()
    gathered: list[Any] = [None] * size
    exchange(lambda: dist.all_gather_object(gathered, values, group=side_group()), rank)
    return [max(column) for column in zip(*gathered)]


def exchange(call: Callable[[], Any], rank: int) -> None:
    """A collective on the side group; its timeout or a lost peer as a PlanError that says what to do."""
    try:
        with adapter.real_tensors():  # planning runs under the partitioner's fake-tensor mode
            call()
    except (RuntimeError, ConnectionError) as exc:  # gloo's timeout and a closed peer are RuntimeErrors
        raise PlanError(f"rank {rank}: the ranks did not agree on a remat plan within {timeout_s():g} s ({exc}); "
                        "every rank must compile the same graphs in the same order; raise REMAT_RANK_TIMEOUT_S "
                        "if rank 0's planning takes longer") from exc


_ERRORS = {cls.__name__: cls for cls in (BudgetError, PlanError, GraphError)}


def error_record(exc: BaseException) -> dict[str, Any]:
    record: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, BudgetError):
        record["fields"] = {"budget_bytes": exc.budget_bytes, "min_feasible_bytes": exc.min_feasible_bytes}
    return record


def error_of(record: dict[str, Any]) -> Exception:
    """Rank 0's error, as the same class with the same message where it is one of remat's."""
    cls = _ERRORS.get(record["type"])
    if cls is BudgetError:
        return BudgetError(record["message"], **record["fields"])
    if cls is not None:
        return cls(record["message"])
    return PlanError(f"rank 0 failed to plan this graph: {record['type']}: {record['message']}")


def in_own_names(record: dict[str, Any], names: list[str], graph: fx.Graph) -> dict[str, Any]:
    """Rank 0's plan record (``plan_cache.record_of``) in this rank's node names: the joint graphs
    are the same by position (the fingerprints agreed), not necessarily by name."""
    own = [n.name for n in graph.nodes]
    if len(own) != len(names):
        raise PlanError(f"rank 0's joint graph has {len(names)} nodes and this rank's {len(own)}, though the "
                        "captured graphs agreed; set REMAT_RANK_AGREEMENT=off and please report this")
    if own == names:
        return record
    return plan_cache.renamed_record(record, dict(zip(names, own)))
