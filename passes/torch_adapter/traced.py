"""What Dynamo's captured graph keeps alive of its own tracing.

Dynamo runs each op of the model on fake tensors and keeps the results in the graph's node meta
(``example_value``). Where the model needs a gradient, those fake results carry autograd nodes, and
an autograd node saves what its backward needs: a Python number the op multiplied or divided by
(``scores / math.sqrt(d)``, ``0.5 * x``) is saved as a real 0-d float64 tensor on the CPU, not a fake
one. So the first call of a compiled model allocates 8 bytes per such op, held as long as the graph
is (remat keeps it to plan it again); ``torch.compile(backend="eager")`` holds the same. Reading
the saved values goes through autograd nodes' ``_saved_*`` attributes, which torch does not document.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor


# a graph's nodes keep their values after capture, so each graph is walked once (the scope, the step's
# other graphs and the backend each ask; a walk takes about 14 us a node)
_WALKED: weakref.WeakKeyDictionary[fx.GraphModule, list[torch.Tensor]] = weakref.WeakKeyDictionary()


def traced_real_tensors(gm: fx.GraphModule) -> list[torch.Tensor]:
    """The real tensors the autograd nodes of ``gm``'s fake example values save (each once)."""
    if gm not in _WALKED:
        _WALKED[gm] = _walk(gm)
    return _WALKED[gm]


def _walk(gm: fx.GraphModule) -> list[torch.Tensor]:
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        for fake in value if isinstance(value, (tuple, list)) else (value,):
            grad_fn = getattr(fake, "grad_fn", None) if isinstance(fake, torch.Tensor) else None
            if grad_fn is None or id(grad_fn) in seen:
                continue
            seen.add(id(grad_fn))
            for saved in _saved_of(grad_fn):
                if isinstance(saved, torch.Tensor) and not isinstance(saved, FakeTensor):
                    found[id(saved)] = saved
    return list(found.values())


def _saved_of(grad_fn: Any) -> list[Any]:
    saved: list[Any] = []
    for name in dir(grad_fn):
        if not name.startswith("_saved_"):
            continue
        try:
            value = getattr(grad_fn, name)
        except RuntimeError:  # freed already (a backward ran through it)
            continue
        saved.extend(value if isinstance(value, (tuple, list)) else (value,))
    return saved
