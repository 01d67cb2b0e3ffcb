"""The public face: ``compile``, ``plan``, ``reports``."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from remat.passes import torch_adapter as adapter
from remat.passes.devices import DeviceSpec, device_spec, planning_for, program_accounted
from remat.passes.decide.attempt import CompileStopped
from remat.passes.torch_adapter.meta_capture import is_meta
from remat.passes.capture.torch_errors import capture_problem, without_interpreter_note

from .backend import RematBackend, named_reports
from .errors import BudgetError, GraphError, PlanError, SolverUnavailable
from .options import Options
from .policies import Policy
from .report import Report

F = TypeVar("F", bound=Callable[..., Any])
_BACKENDS: weakref.WeakKeyDictionary[Any, RematBackend] = weakref.WeakKeyDictionary()


def compile(model: F, budget_gb: float | None = None, *, solver: str = "ilp", time_limit_s: float = 30.0,
            profile: str = "measure", compiler: str = "inductor", headroom: float | None = None,
            plan_cache: bool | str = True, policy: Policy | str | None = None, checkpoint_regions: str = "recompute",
            budget_scope: str = "auto", dynamic: bool | None = None, fullgraph: bool = False) -> F:
    """``torch.compile`` whose partitioner fits each graph's step in ``budget_gb`` GiB.

    Raises :class:`remat.BudgetError` at the first call if the budget is below
    what any plan reaches. ``remat.reports(compiled)`` lists one Report per
    compiled graph.
    """
    options = Options.pick(locals())
    if fullgraph and is_fully_sharded(model):
        raise GraphError("fullgraph=True cannot capture an FSDP2 (fully_shard) model whole: FSDP2's hooks run "
                         "outside compiled graphs. Compile each block instead (torchtitan's order: checkpoint "
                         "wrap, remat.compile or block.compile(backend='remat') per block, then fully_shard), "
                         "or drop fullgraph=True.")
    backend = RematBackend(options)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    if isinstance(compiled, torch.nn.Module):
        compiled.forward = with_signature_of(model.forward, raising_budget_errors(compiled.forward))
        keep_original_keys(compiled)
    else:
        compiled = raising_budget_errors(compiled)
    _BACKENDS[compiled] = backend
    return compiled  # type: ignore[return-value]


def compile_in_place(module: torch.nn.Module, options: Options, *, dynamic: bool | None = None,
                     fullgraph: bool = False) -> RematBackend:
    """``module.compile(backend=remat)``: the module itself runs compiled, for trainers that hold it
    (same object, class, ``state_dict`` keys and signature). ``remat.reports(module)`` then lists its plans."""
    backend = RematBackend(options)
    module.compile(backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    # nn.Module.compile keeps torch.compile's result here: wrapped, remat's errors surface as in compile()
    module._compiled_call_impl = raising_budget_errors(module._compiled_call_impl)
    _BACKENDS[module] = backend
    return backend


def with_signature_of(original: Callable[..., Any], forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` showing ``original``'s parameters: trainers (Hugging Face's ``remove_unused_columns``)
    read them to pick which batch columns to pass, and torch.compile's own forward takes ``*args, **kwargs``."""
    try:
        forward.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # a forward inspect cannot read: leave torch.compile's
        pass
    return forward


ORIGINAL = "_orig_mod"  # where torch.compile's OptimizedModule holds the module it compiled


def keep_original_keys(compiled: torch.nn.Module) -> None:
    """``compiled.state_dict()`` keyed as the original module's, and ``load_state_dict`` taking either
    keys, so that checkpoints move between the compiled and the plain model (torch.compile adds
    ``_orig_mod.`` to every key)."""
    compiled.register_state_dict_post_hook(without_original_prefix)
    compiled.register_load_state_dict_pre_hook(with_original_prefix)
    compiled.register_load_state_dict_post_hook(name_keys_as_original)


def without_original_prefix(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    inner = prefix + ORIGINAL
    for key in [k for k in state_dict if k.startswith(inner + ".")]:  # in order: these are the last keys
        state_dict[prefix + key[len(inner) + 1:]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:  # per-module versions, which load_state_dict reads by the module's name
        for key in [k for k in metadata if k == inner or k.startswith(inner + ".")]:
            metadata[(prefix + key[len(inner) + 1:]) if key != inner else prefix[:-1]] = metadata.pop(key)


def with_original_prefix(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    inner = prefix + ORIGINAL + "."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:  # reachable at the root only: nested modules get a plain dict
        for key in [k for k in metadata if k.startswith(prefix) and not k.startswith(inner)]:
            metadata.setdefault((inner + key[len(prefix):]) if key else ORIGINAL, metadata[key])


def name_keys_as_original(module: torch.nn.Module, incompatible: Any) -> None:
    """Missing and unexpected keys, named as in ``state_dict()``, for load_state_dict's error."""
    for keys in (incompatible.missing_keys, incompatible.unexpected_keys):
        keys[:] = [".".join(part for part in key.split(".") if part != ORIGINAL) for key in keys]


def is_fully_sharded(model: object) -> bool:
    """Whether ``model`` or one of its submodules was wrapped by FSDP2's ``fully_shard``."""
    return isinstance(model, torch.nn.Module) and any(adapter.is_fsdp2_module(m) for m in model.modules())


def raising_budget_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Surface remat's own errors instead of dynamo's wrapper around them."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            inner = adapter.unwrap_backend_error(exc)
            if isinstance(inner, (BudgetError, PlanError, ValueError, TypeError, SolverUnavailable)):
                raise without_interpreter_note(inner) from None
            explained = graph_error(exc)
            if explained is not None:
                raise explained from None
            raise

    return call


def graph_error(exc: BaseException) -> GraphError | None:
    """A capture failure remat can explain, as a :class:`GraphError` saying what to do."""
    problem = capture_problem(exc)
    if problem is None:
        return None
    kind, what = problem
    if kind == "ddp-bucket":
        return GraphError(
            "torch.compile splits a DDP model's graph at DDP's gradient buckets, and refused these: the "
            "first bucket (the last layers, bucketed first) is larger than the others, as happens with a "
            "small bucket_cap_mb. Raise bucket_cap_mb (torch's default is 25), or compile one graph with "
            "torch._dynamo.config.optimize_ddp = False.")
    if kind == "dynamic":
        return GraphError(
            f"remat pins dynamic sizes under a budget (a plan holds for the sizes it was made at), but "
            f"{what or 'a size'} was marked with torch._dynamo.mark_dynamic, which forbids pinning it. "
            f"Use torch._dynamo.maybe_mark_dynamic or dynamic=True (each new size is then planned again), "
            f"or budget_gb=None to keep the size symbolic.")
    return GraphError(
        f"{what} has no fake (meta) kernel, so its output shapes cannot be traced without running it and "
        f"remat cannot capture the graph. Register one with torch.library.register_fake (for a "
        f"torch.library.custom_op, @op.register_fake), or call the op outside the compiled function.")


def reports(compiled: Any = None) -> list[Report]:
    """Reports of ``compiled`` (from ``remat.compile``); without it, every
    report made through ``backend="remat"`` in this process."""
    if compiled is None:
        return named_reports()
    backend = _BACKENDS.get(compiled)
    if backend is None:
        raise ValueError("reports() takes what remat.compile returned; for backend='remat' call remat.reports()")
    return backend.reports


def plan(model: Callable[..., Any], *inputs: Any, budget_gb: float | None = None, solver: str = "ilp",
         time_limit_s: float = 30.0, profile: str = "measure", compiler: str = "inductor",
         headroom: float | None = None, plan_cache: bool | str = True,
         policy: Policy | str | None = None, checkpoint_regions: str = "recompute",
         budget_scope: str = "auto", loss_fn: Callable[[Any], torch.Tensor] | None = None,
         device: str | DeviceSpec | None = None) -> Report:
    """Plan ``model(*inputs)`` under ``budget_gb`` and return the Report.

    No training step runs and no parameter, buffer or gradient changes:
    capture stops as soon as the first graph's plan is made. ``compiler``
    must match the one the model will be compiled with: Inductor's joint
    graph is decomposed further and its fusion changes what is allocated.

    ``loss_fn(output) -> scalar``: the loss your step computes outside the model (targets bound in it,
    e.g. ``lambda logits: F.cross_entropy(logits.flatten(0, 1), y.flatten())``). remat runs it and its
    backward once, on random outputs shaped like the model's, and counts what it allocates instead of the
    reservation made before a first step (see docs/budget.md).

    A model and inputs on the meta device plan for ``device`` (a name from
    ``remat.passes.devices.names()``, such as "h100-80gb", or a ``DeviceSpec``; None: this machine's
    CPU) without allocating or running anything: sizes exact from shapes, times analytic, the whole
    model captured as one graph (see docs/capacity.md).
    """
    options = Options.pick(locals())
    return captured(model, inputs, options, loss_fn=loss_fn, device=device).reports[0]


def captured(model: Callable[..., Any], inputs: tuple[Any, ...], options: Options, *,
             loss_fn: Callable[[Any], torch.Tensor] | None = None,
             device: str | DeviceSpec | None = None, dynamic: bool | None = None) -> RematBackend:
    """The backend holding the plan of ``model(*inputs)``'s first graph (``remat.plan``'s capture);
    ``dynamic`` as ``torch.compile``'s (False: the sizes of ``inputs``, never a symbolic one)."""
    if on_meta(model, inputs):
        return captured_on_meta(model, inputs, options, device_spec(device or "cpu"), loss_fn, dynamic)
    if device is not None:
        raise ValueError(f"device={device!r} plans a model on the meta device, and this one is not: move the "
                         f"model and inputs with .to('meta') (nothing is allocated), or leave device out")
    backend = RematBackend(options, stop_after_plan=True, loss_fn=loss_fn)
    capture(model, inputs, backend, dynamic=dynamic)
    return backend


def capture(model: Callable[..., Any], inputs: tuple[Any, ...], backend: RematBackend, *,
            fullgraph: bool = False, dynamic: bool | None = None) -> None:
    """Capture ``model(*inputs)`` until ``backend`` planned its first graph."""
    try:
        torch.compile(model, backend=backend, fullgraph=fullgraph, dynamic=dynamic)(*inputs)
    except Exception as exc:
        inner = adapter.unwrap_backend_error(exc) or exc
        if not isinstance(inner, CompileStopped):
            explained = graph_error(exc) or (not_whole(exc) if fullgraph else None)
            if explained is not None:
                raise explained from None
            raise inner from None
    if not backend.reports:
        raise ValueError("nothing to plan: the model produced no graph that needs a backward "
                         "(do its outputs require grad?)")


def on_meta(model: Callable[..., Any], inputs: tuple[Any, ...]) -> bool:
    """Whether the model's parameters or its inputs live on the meta device (a buffer alone does not
    decide: a model may hold one there that its forward never reads)."""
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    return is_meta((params, inputs))


def captured_on_meta(model: Callable[..., Any], inputs: tuple[Any, ...], options: Options, spec: DeviceSpec,
                     loss_fn: Callable[[Any], torch.Tensor] | None, dynamic: bool | None = None) -> RematBackend:
    """Plan a meta model for ``spec``: captured whole (a graph break would leave part of the step
    out), profiled analytically, no plan cache (its key knows no device spec)."""
    if loss_fn is not None:
        raise ValueError("loss_fn is measured by running it, which the meta device cannot: compute the "
                         "loss inside the model's forward to plan it on meta")
    if any(torch.is_autocast_enabled(kind) for kind in ("cpu", "cuda")):
        raise ValueError("autocast does not reach meta tensors (torch has no autocast for the meta device), so "
                         "the plan would be full precision's: plan outside autocast with the model in the dtype "
                         "it trains in (model.to(torch.bfloat16)), or plan on the real device")
    options = dataclasses.replace(options, profile="analytic", plan_cache=False)
    backend = RematBackend(options, stop_after_plan=True)
    with planning_for(spec):
        capture(model, inputs, backend, fullgraph=True, dynamic=dynamic)
    graph_plan = backend.plans[0]
    # (the device is read by the report only: not part of the problem's key)
    problem = dataclasses.replace(graph_plan.problem, meta={**graph_plan.problem.meta, "device": f"meta:{spec.name}"})
    backend.superseded(graph_plan, graph_plan.revised(problem=problem).noted(
        f"planned on the meta device for {spec.name}: sizes exact from shapes, times analytic (FLOPs and bytes "
        f"over the device's peaks); " + meta_program_note(options.compiler, spec)))
    return backend


def meta_program_note(compiler: str, spec: DeviceSpec) -> str:
    """What a meta plan's peaks are: the FX-level model's, or the program Inductor generated for the device."""
    if program_accounted(compiler, spec):
        return ("the compiled peaks are the program Inductor generates for this device, compiled for fake "
                "inputs (nothing run); a C++ kernel's own scratch is unknown on meta (0)")
    if compiler != "inductor":
        return "every figure is the FX-level model"
    return ("every figure is the FX-level model (with Inductor's fusion): Inductor's program for this device "
            "needs its code generation there, so none is accounted for")


def not_whole(exc: BaseException) -> GraphError | None:
    """A meta model dynamo could not capture as one graph, as a :class:`GraphError` naming why."""
    if not adapter.is_graph_break(exc):
        return None
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    reason = reason.replace("Consider annotating your code using torch._check*(). ", "").strip()
    stack = getattr(exc, "real_stack", None) or []
    where = f" at {stack[-1].filename}:{stack[-1].lineno} `{(stack[-1].line or '').strip()}`" if stack else ""
    return GraphError(f"a model on the meta device must be captured as one graph, and this one cannot{where}: "
                      f"{reason}. A data-dependent branch or .item() needs real values: move it out of the "
                      f"model's forward, or plan on the real device")
