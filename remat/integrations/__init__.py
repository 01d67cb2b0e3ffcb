"""One-line routes into the trainers people use (see docs/trainers.md).

- ``remat.integrations.hf.RematCallback``: Hugging Face ``Trainer(callbacks=[...])``.
- accelerate and Lightning take ``remat.compile(model, ...)`` as it is: ``accelerator.prepare`` keeps a
  compiled module, and a ``LightningModule`` may hold one.

Each submodule imports its trainer; this package imports none.
"""
