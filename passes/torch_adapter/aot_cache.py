"""AOTAutograd's cache keyed on remat's plan (``passes/cache/program_cache.py`` uses it).

AOTAutograd's cache keys on the dynamo graph, its inputs and the settings, not on the saved set
a partitioner chose. A plan's digest enters the key through an Inductor setting that holds a
no-op pass (``_PlanKey``) while the key is made; ``compile_inductor`` empties it before
Inductor's own passes. The fitting loop's compiles record their entries unwritten
(``recording_program_entries``); the accepted one is written under its plan's key later
(``store_entry``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch._inductor import custom_graph_pass

__all__ = ["ProgramEntry", "keyed_on_plan", "program_cache_usable", "recording_program_entries", "store_entry",
           "without_plan_key"]


class _PlanKey(custom_graph_pass.CustomGraphPass):
    """Names a plan in AOTAutograd's cache key. It sits in an Inductor setting only while that
    key is made: ``compile_inductor`` takes it out before Inductor's own passes, so it never
    runs and no FX graph cache key sees it (a program's FX entries are shared by every plan
    that yields the same graph)."""

    def __init__(self, digest: str) -> None:
        self.digest = digest

    def __call__(self, graph: fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return f"remat.plan.{self.digest}"


_PLAN_KEY_SETTING = "post_grad_custom_post_pass"


def without_plan_key() -> dict[str, Any]:
    """The setting that carried a plan's key, emptied again (nothing else was there)."""
    return {_PLAN_KEY_SETTING: None} if isinstance(getattr(inductor_config, _PLAN_KEY_SETTING, None), _PlanKey) else {}


def program_cache_usable() -> bool:
    """Whether AOTAutograd's local cache is on in this process (call it outside remat's
    compile, which turns the cache off), and the setting that carries the plan's key is free
    (a post-grad pass of the user's would be dropped from Inductor's key)."""
    from torch._functorch._aot_autograd.autograd_cache import should_use_local_autograd_cache

    return should_use_local_autograd_cache() and getattr(inductor_config, _PLAN_KEY_SETTING, 0) is None


@contextlib.contextmanager
def keyed_on_plan(digest: str, settings: dict[str, Any]) -> Iterator[None]:
    """AOTAutograd's cache on in the block, its key naming the plan ``digest`` beside the
    dynamo graph, its inputs and the Inductor ``settings``: a hit loads the forward and
    backward programs compiled for that plan (nothing traced, partitioned or generated); a
    miss compiles and saves them under that key. The backward is compiled with the forward, so
    the entry is saved by the time the compile returns."""
    with functorch_config.patch(enable_autograd_cache=True, force_non_lazy_backward_lowering=True), \
            inductor_config.patch({**settings, "fx_graph_cache": True, _PLAN_KEY_SETTING: _PlanKey(digest)}):
        yield


@dataclasses.dataclass(frozen=True)
class ProgramEntry:
    """AOTAutograd's cache entry for one compile, not yet written: what its key is made of (the
    arguments, and AOTAutograd's settings then: ``compile_fx`` patches some), and the entry."""

    key_arguments: tuple[tuple[Any, ...], dict[str, Any]]
    functorch_settings: dict[str, Any]
    entry: Any


@contextlib.contextmanager
def recording_program_entries() -> Iterator[list[ProgramEntry]]:
    """AOTAutograd's cache on in the block, under a key no entry is stored under: each compile
    makes its cache entry, recorded in the list instead of written (the plan it holds is not
    yet accepted). ``store_program_entry`` writes one later, under its plan's key."""
    from torch._functorch._aot_autograd import autograd_cache as aot_cache

    recorded: list[ProgramEntry] = []
    arguments: list[tuple[tuple[tuple[Any, ...], dict[str, Any]], dict[str, Any]]] = []
    real_key, real_save = aot_cache.autograd_cache_key, aot_cache.AOTAutogradCache.__dict__["save"]

    def key(*args: Any, **kwargs: Any) -> Any:
        arguments.append(((args, kwargs), functorch_config.get_config_copy()))
        return real_key(*args, **kwargs)

    def save(key: str, entry: Any, remote: bool = False) -> None:
        if arguments:
            recorded.append(ProgramEntry(*arguments[-1], entry))

    aot_cache.autograd_cache_key = key
    aot_cache.AOTAutogradCache.save = staticmethod(save)
    try:
        with functorch_config.patch(enable_autograd_cache=True), \
                inductor_config.patch({"fx_graph_cache": True,  # for the key; compile_inductor sets each graph's
                                       _PLAN_KEY_SETTING: _PlanKey(f"unsaved.{os.getpid()}.{id(recorded)}")}):
            yield recorded
    finally:
        aot_cache.autograd_cache_key, aot_cache.AOTAutogradCache.save = real_key, real_save


def store_entry(program: ProgramEntry, digest: str, settings: dict[str, Any]) -> None:
    """Write a recorded entry into AOTAutograd's cache under the key ``keyed_on_plan(digest,
    settings)`` looks up."""
    from torch._functorch._aot_autograd import autograd_cache as aot_cache

    args, kwargs = program.key_arguments
    with keyed_on_plan(digest, settings), functorch_config.patch(program.functorch_settings):
        key, _ = aot_cache.autograd_cache_key(*args, **kwargs)
        aot_cache.AOTAutogradCache.save(key, program.entry, remote=False)
