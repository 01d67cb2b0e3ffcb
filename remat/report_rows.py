"""The pieces of a Report's rows: each node's decision and why, and the user's names.

What ``remat.report.node_rows`` fills a ``NodeRow`` with: the op's kind and short name
(``op_category``, ``short_op``), the plan's decision and its reason in words (``Context``,
``decision_of``, ``kept_reason``, ``recomputed_reason``), the module, input name, source line
and label (``user_names``), and what a report plots by module (``module_spans``,
``peak_module``). Plain records only: no torch, as in ``remat.report``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remat.solvers.problem import Kind, Problem, Value
from remat.solvers.solution import Solution

# --- decisions and their reasons ---------------------------------------------

def op_category(value: Value, by_name: dict[str, Value] | None = None) -> str:
    """What kind of op made ``value`` (the passes' classification, ``remat.passes.capture.taxonomy``)."""
    if value.kind is Kind.INPUT:
        return "input"
    return value.category or "other"


def short_op(op: str) -> str:
    """``aten.addmm.default`` -> ``addmm``; ``<built-in function getitem>`` -> ``getitem``."""
    if op.startswith("<built-in function "):
        return op.removeprefix("<built-in function ").rstrip(">")
    return op.split(".")[1] if op.count(".") == 2 else op


def gap_text(gap: float | None) -> str:
    """The MIP gap for people: ``0.0094`` -> ``0.94 %``; unknown when the solver gave none."""
    return "unknown" if gap is None else f"{gap:.2%}"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.3g} MiB"


@dataclass(frozen=True)
class Context:
    """What a reason may refer to: every value by name, and who needs which operand kept."""

    by_name: dict[str, Value]
    kept_for: dict[str, str]  # operand -> a recomputed value that needs it kept
    names: dict[str, Any] = field(default_factory=dict)  # the user's names by node (remat.passes.capture.names)

    def call(self, name: str) -> str:
        """How a reason names another value: the user's name for it where known, else the node's."""
        user = self.names.get(name)
        label = getattr(user, "variable", "") or getattr(user, "input", "")
        module = getattr(user, "module", "")
        return f"{label} in {module}" if label and module else label or name

    @staticmethod
    def of(problem: Problem, solution: Solution, names: dict[str, Any] | None = None) -> Context:
        by_name = problem.by_name()
        kept_for = {}
        for name in sorted(solution.recomputed):
            value = by_name.get(name)
            for operand in value.keep_operands if value else ():
                kept_for.setdefault(operand, name)
            for operand in value.operands if value else ():
                if operand in solution.saved and not by_name[operand].direct_need:
                    kept_for.setdefault(operand, name)  # kept only so that ``name`` can be recomputed
        return Context(by_name, kept_for, names or {})

    def origin(self, v: Value) -> Value:
        """The op that computes ``v``: itself, or for an element of a multi-output op, that op."""
        if "getitem" in v.op and v.operands and v.operands[0] in self.by_name:
            return self.by_name[v.operands[0]]
        return v


def decision_of(v: Value, solution: Solution, context: Context | None = None) -> tuple[str, str]:
    if v.kind is Kind.INPUT:
        return "input", "graph input: alive throughout the step"
    if v.kind is Kind.BACKWARD:
        return "backward", "computed in the backward"
    context = context or Context({v.name: v}, {})
    if v.name in solution.saved:
        return "kept", kept_reason(v, context)
    if v.name in solution.recomputed:
        return "recomputed", recomputed_reason(v, context)
    return "freed", "freed after its last forward use: the backward never reads it"


def kept_reason(v: Value, context: Context) -> str:
    if v.recompute_ban:
        return f"kept: {v.recompute_ban}"
    origin = context.origin(v)
    what = op_category(v, context.by_name)
    made_by = f"{what} output" if origin is v else f"output of {short_op(origin.op)} ({what})"
    if v.name in context.kept_for:
        return f"kept: {made_by}, needed to recompute {context.call(context.kept_for[v.name])}"
    return f"kept: {made_by}, recompute would cost {ms(origin.recompute_seconds)}"


def recomputed_reason(v: Value, context: Context) -> str:
    if v.bytes == 0:
        return "recomputed: a view, free"
    what = op_category(v, context.by_name)
    if v.save_seconds > 0 or v.recompute_bytes == 0:
        return f"recomputed: {what}, fused into its consumer, frees {mib(v.bytes)}"
    return f"recomputed: {what}, frees {mib(v.bytes)} for {ms(context.origin(v).recompute_seconds)}"


def user_names(v: Value, name: Any) -> dict[str, str]:
    """A row's module, input name, source line and label, from its node's ``NodeName`` (or none)."""
    module = getattr(name, "module", "")
    given = getattr(name, "input", "")
    label = given or getattr(name, "variable", "") or ("" if v.kind is Kind.INPUT else short_op(v.op))
    return {"module": module, "input_name": given, "source": getattr(name, "source", ""), "label": label}


def module_spans(step_names: tuple[str, ...], names: dict[str, Any]) -> list[tuple[int, int, str]]:
    """Runs of consecutive steps in one layer (``layers.3``) or top-level module (``head``);
    steps with no module recorded continue the run around them.

    >>> from types import SimpleNamespace as N
    >>> spans = module_spans(("a", "b", "c", "d"), {"a": N(module="layers.0.attn"), "b": N(module="layers.0.mlp"),
    ...                                             "d": N(module="head")})
    >>> spans
    [(0, 2, 'layers.0'), (3, 4, 'head')]
    """
    modules = [getattr(names.get(step), "module", "") for step in step_names]
    depth = max((layer_depth(m) for m in modules), default=0) or 2
    spans: list[list[Any]] = []
    for step, module in enumerate(modules):
        if not module:
            continue
        parts = module.split(".")
        group = ".".join(parts[:layer_depth(module) or max(1, depth - 1)])
        if spans and spans[-1][2] == group:
            spans[-1][1] = step + 1
        else:
            spans.append([step, step + 1, group])
    return [(start, end, group) for start, end, group in spans]


def layer_depth(module: str) -> int:
    """How many parts of ``module`` name its layer: through its first index (``layers.3`` of
    ``layers.3.attn`` is 2), 0 when it has none."""
    parts = module.split(".")
    return next((i + 1 for i, part in enumerate(parts) if part.isdigit()), 0)


def peak_module(problem: Problem, solution: Solution, names: dict[str, Any]) -> str:
    """The module whose op runs at the plan's peak ("" when it has no name)."""
    if not solution.timeline or not problem.step_names:
        return ""
    step = max(range(len(solution.timeline)), key=solution.timeline.__getitem__)
    name = names.get(problem.step_names[step]) if step < len(problem.step_names) else None
    return getattr(name, "module", "")
