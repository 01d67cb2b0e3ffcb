"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[RematCallback(budget_gb=...)])``.

``transformers.TrainingArguments(torch_compile_backend=...)`` takes only accelerate's list of backend
names, so remat cannot be named there; this callback compiles the Trainer's model in place as training
begins instead. ``Trainer(model=remat.compile(model, budget_gb=...))`` works too.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from remat.api import compile_in_place
from remat.backend import RematBackend
from remat.options import Options
from remat.report import Report


class RematCallback(TrainerCallback):
    """Compile the Trainer's model with remat under ``budget_gb`` GiB when training begins.

    ``options``: those of :func:`remat.compile` (``solver``, ``profile``, ``compiler``, ``policy``,
    ``dynamic``, ``fullgraph``, ...). The model is compiled in place (``model.compile``): it keeps its
    class, ``state_dict`` keys and ``save_pretrained``. ``callback.reports()`` (or
    ``remat.reports(model)``) lists one Report per compiled graph.
    """

    def __init__(self, budget_gb: float | None = None, *, dynamic: bool | None = None, fullgraph: bool = False,
                 **options: Any) -> None:
        unknown = sorted(set(options) - set(Options.names()))
        if unknown:
            raise TypeError(f"RematCallback got unknown option(s) {unknown}; it takes budget_gb, dynamic, "
                            f"fullgraph and remat.compile's options: {sorted(Options.names())}")
        self.options = Options(budget_gb=budget_gb, **options)
        self.dynamic = dynamic
        self.fullgraph = fullgraph
        self.backend: RematBackend | None = None
        self.model: torch.nn.Module | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None,
                       **kwargs: Any) -> None:
        if model is None:
            raise ValueError("RematCallback needs the Trainer's model: pass model= to Trainer "
                             "(model_init is called before this callback runs, so it works too)")
        if model is self.model:  # train() again (or resumed): already compiled
            return
        self.backend = compile_in_place(model, self.options, dynamic=self.dynamic, fullgraph=self.fullgraph)
        self.model = model

    def reports(self) -> list[Report]:
        """One Report per graph compiled so far (empty before training begins)."""
        return [] if self.backend is None else self.backend.reports
