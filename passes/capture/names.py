"""Names pass: the user's names for the joint graph's nodes, as plain strings.

A report row named ``addmm_1`` or ``primals_3`` means nothing to the person who wrote
``self.fc1``. Dynamo records, for each traced op, the module that ran it
(``meta["nn_module_stack"]``, outermost first; a backward op carries its forward op's as
``fwd_nn_module_stack``) and the user's source line (``meta["stack_trace"]``); each of its
graph inputs knows the parameter, buffer or argument it came from. AOTAutograd keeps both:
a joint graph input says which dynamo input it is (``meta["desc"]``).

Only names read from that metadata are given; a node without any keeps an empty module
(never a neighbour's guess), except an element of a multi-output op or a view, which is its
op's or its base's.

>>> module_path("L['self'].model.layers.0.self_attn")
'model.layers.0.self_attn'
>>> module_path("L['self']._modules['layers']._modules['3']._parameters['weight']")
'layers.3.weight'
>>> module_path("G['model']")
''
>>> user_frame('  File "/src/net.py", line 12, in forward\\n    return self.fc1(x)\\n')[0]
'net.py:12'
"""

from __future__ import annotations

import logging
import operator
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

log = logging.getLogger(__name__)

# Dynamo's containers of a module's children, parameters and buffers: not part of a user's name.
CONTAINERS = frozenset({"_modules", "_parameters", "_buffers"})
ROOT = re.compile(r"^\s*(?:[LG]\[['\"][^'\"]*['\"]\]|self)")  # the compiled callable's own name
PART = re.compile(r"\.(\w+)|\[['\"]?([^'\"\]]+)['\"]?\]")
FRAME = re.compile(r'File "([^"]+)", line (\d+)')
ASSIGN = re.compile(r"^(?:self\.)?([A-Za-z_]\w*)\s*(?::[^=]*)?(?:[-+*/@]?=)(?!=)")
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


@dataclass(frozen=True)
class NodeName:
    """What a user calls one node: the module that ran it (``layers.3.attn``; "" where none
    was recorded: code of the compiled model's own forward), for a graph input the parameter,
    buffer or argument it is (``layers.3.attn.q_proj.weight``, ``x``), and the user's source
    line (``net.py:12``)."""


    module: str = ""
    input: str = ""
    source: str = ""
    variable: str = ""  # the variable its source line assigns (``q`` for ``q = self.q_proj(x)``)


def module_path(path: str) -> str:
    """Dynamo's name for a module or tensor, as the user's dotted path (``model.named_modules()``)."""
    text = str(path)
    while text.startswith("getattr("):  # getattr(L['self'].layers, '0') in some versions
        inner = re.match(r"getattr\((.*),\s*['\"]([^'\"]+)['\"]\)$", text)
        if inner is None:
            break
        text = f"{inner.group(1)}.{inner.group(2)}"
    root = ROOT.match(text)
    if root is None:
        return ""
    parts = [a or b for a, b in PART.findall(text[root.end():])]
    return ".".join(p for p in parts if p not in CONTAINERS)


def argument_name(path: str) -> str:
    """A graph input that is no module state: the argument's own name (``L['x']`` -> ``x``)."""
    found = re.match(r"^[LG]\[['\"]([^'\"]+)['\"]\]", str(path))
    return found.group(1) if found else ""


def user_frame(stack_trace: str | None) -> tuple[str, str, bool]:
    """The last frame of ``stack_trace`` outside torch itself: (``file.py:123``, its code line,
    whether torch's own code ran after it: the op is inside a torch module such as ``nn.Linear``)."""
    lines = (stack_trace or "").splitlines()
    found, in_torch = ("", ""), False
    for i, text in enumerate(lines):
        frame = FRAME.search(text)
        if frame is None:
            continue
        in_torch = frame.group(1).startswith(TORCH_DIR)
        if not in_torch:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            found = (f"{os.path.basename(frame.group(1))}:{frame.group(2)}", code)
    return (*found, in_torch)


def variable_of(module: str, kind: str, code: str, in_torch: bool) -> str:
    """A short name for an op's value: inside a torch module (``nn.Linear``) the module's own
    name (``q_proj``; its class, ``gelu``, where its name is an index in a ``Sequential``), else
    the variable its user line assigns (``scores``)."""
    if in_torch and module:
        leaf = module.rpartition(".")[2]
        return kind.lower() if leaf.isdigit() and kind else leaf
    return assigned_name(code)


def assigned_name(code: str) -> str:
    """The variable a line of code assigns (``q = self.q_proj(x)`` -> ``q``), or "".

    >>> assigned_name("attn = scores.softmax(-1)"), assigned_name("return self.fc(x)"), assigned_name("x += y")
    ('attn', '', 'x')
    """
    found = ASSIGN.match(code)
    return found.group(1) if found else ""


def innermost_module(node: fx.Node) -> str | None:
    """The innermost module that ran ``node`` (or its forward op, for a backward op); ""
    for code the compiled callable runs itself; None where nothing was recorded."""
    meta = node.meta
    if "nn_module_stack" in meta or "fwd_nn_module_stack" in meta:
        entries = module_entries(node)
        return module_path(entries[-1][0]) if entries else ""
    if meta.get("autograd_backward") or meta.get("is_gradient_acc") or meta.get("partitioner_tag") == "is_backward":
        return None  # a backward op without its forward op's modules (a gradient sum): unknown
    if meta.get("stack_trace"):  # traced from user code that ran in no submodule
        return ""
    return None


def module_entries(node: fx.Node) -> list[tuple]:
    """(path, class) of each module of the model that ran ``node``, outermost first. A module
    reached some other way (a function Hugging Face wraps as a module, ``G['...'].apply_rotary_pos_emb``)
    is not one of the model's: entries not under the outermost one's root are left out."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    entries = [tuple(entry) for entry in stack.values()]
    root = ROOT.match(str(entries[0][0])) if entries else None
    if root is None:
        return entries
    return [e for e in entries if str(e[0]).startswith(root.group(0))]


def torch_module(node: fx.Node) -> str | None:
    """The class name of the innermost module that ran ``node`` if it is one of torch's
    (``Linear``): its code is torch's, so the user's line is the one that called the module."""
    entries = module_entries(node)
    kind = entries[-1][1] if entries and len(entries[-1]) > 1 else None
    if not str(getattr(kind, "__module__", kind or "")).startswith("torch.nn"):
        return None
    return getattr(kind, "__name__", str(kind).rpartition(".")[2])


def input_names(gm: fx.GraphModule) -> dict[Any, str]:
    """A dynamo graph's inputs by the user's names: by position (placeholders, as AOTAutograd
    numbers them) and by attribute (state the graph reads with ``get_attr``)."""
    names: dict[Any, str] = {}
    for index, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        source = getattr(node.meta.get("grapharg"), "source", None)
        text = getattr(source, "name", "") if source is not None else ""
        text = text() if callable(text) else str(text)
        names[index] = (module_path(text) if re.search(r"_parameters\[|_buffers\[", text)
                        else argument_name(text))
    names.update(getattr(gm, "meta", {}).get("dynamo_flat_name_to_original_fqn", {}))
    return names


def input_name(node: fx.Node, inputs: dict[Any, str]) -> str:
    """A joint graph input's user name, from the dynamo input AOTAutograd says it is."""
    desc = node.meta.get("desc")
    while desc is not None:
        if hasattr(desc, "target") and type(desc).__name__ in ("ParamAOTInput", "BufferAOTInput"):
            return inputs.get(desc.target, str(desc.target))
        if type(desc).__name__ == "PlainAOTInput":
            return inputs.get(desc.idx, "")
        desc = getattr(desc, "base", None)  # a tensor subclass's inner tensor: the outer one's name
    return ""


def node_names(graph: fx.Graph, inputs: dict[Any, str] | None = None) -> dict[str, NodeName]:
    """Each named node of the joint graph, by node name (nodes with no name at all are left out)."""
    inputs = inputs or {}
    names: dict[str, NodeName] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            user = input_name(node, inputs)
            if user:
                module = user.rpartition(".")[0] if "." in user else ""
                names[node.name] = NodeName(module, user)
            continue
        module = innermost_module(node)
        if module is None:
            module = borrowed_module(node, names)
        if module is None:
            continue
        source, code, in_torch = user_frame(node.meta.get("stack_trace"))
        kind = torch_module(node)
        names[node.name] = NodeName(module, "", source, variable_of(module, kind or "", code, in_torch or bool(kind)))
    return names


def borrowed_module(node: fx.Node, names: dict[str, NodeName]) -> str | None:
    """An element of a multi-output op is its op's; a view, its base's; nothing else borrows."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.target is operator.getitem or getattr(node.target, "is_view", False):
        base = names.get(node.args[0].name)
        return None if base is None or base.input else base.module
    return None


def names_of(graph: fx.Graph, inputs: dict[Any, str] | None = None) -> dict[str, NodeName]:
    """:func:`node_names`, or none where this torch records its metadata otherwise: names serve
    the report, and reading them must never stop a compile (logged, not silent)."""
    try:
        return node_names(graph, inputs)
    except Exception as exc:  # noqa: BLE001 - any shape of metadata we did not foresee
        log.warning("remat: could not read the user's names of the graph's nodes (%s: %s); the report "
                    "shows node names only", type(exc).__name__, exc)
        return {}


def names_of_inputs(gm: fx.GraphModule) -> dict[Any, str]:
    """:func:`input_names`, or none where this torch records its inputs otherwise (logged)."""
    try:
        return input_names(gm)
    except Exception as exc:  # noqa: BLE001 - as names_of
        log.warning("remat: could not read the user's names of the graph's inputs (%s: %s)", type(exc).__name__, exc)
        return {}
