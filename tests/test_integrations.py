"""The trainers people use take remat in one line (docs/trainers.md): Hugging Face Trainer, accelerate, Lightning.

Each route trains a few steps and must log eager's losses under a budget that binds. The compiles run
op by op ("eager" compiler) with "analytic" costs, so they take seconds: what is tested is the route into
each trainer, not Inductor. Tests of a trainer that is not installed are skipped
(``pip install -e '.[integration]'``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import remat
from remat.errors import GIB

FAST = {"compiler": "eager", "profile": "analytic"}  # what the routes pass on is what is tested, not Inductor
STEPS = 3
ROWS = 512  # per batch: activations, not parameters, dominate the MLP's step, so a budget can bind
# Of the way from remat.plan's smallest feasible to store-all: low, as the plan reserves three times the
# model's outputs for the loss computed after it, and the trained step counts what that loss measured.
BINDING = 0.1


@pytest.fixture(scope="module", autouse=True)
def environment_kept() -> Iterator[None]:
    """The trainers set environment variables (Lightning: PYTORCH_NVML_BASED_CUDA_CHECK,
    TORCHINDUCTOR_CACHE_DIR) that later tests and their subprocesses would inherit."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def assert_binds(reports: list[remat.Report], budget_gb: float) -> None:
    """Every plan fits the budget, and the budget is below what storing everything would take."""
    assert reports and all(r.budget_bytes == int(budget_gb * GIB) for r in reports)
    assert all(r.predicted_peak_bytes <= r.budget_bytes for r in reports)
    assert any(r.store_all_peak_bytes > r.budget_bytes and r.recomputed for r in reports)


class Tagger(nn.Module):
    """A model whose forward names its inputs, as trainers read them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.norm = nn.BatchNorm1d(8)  # a buffer and a versioned state_dict entry

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.norm(self.embed(input_ids))


def test_compiled_module_shows_the_original_signature_and_state_dict_keys() -> None:
    model = Tagger()
    compiled = remat.compile(model, budget_gb=1.0, **FAST)
    assert inspect.signature(compiled.forward) == inspect.signature(model.forward)
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert compiled.state_dict()._metadata.keys() == model.state_dict()._metadata.keys()
    assert all(p is q for p, q in zip(compiled.parameters(), model.parameters(), strict=True))
    # Checkpoints move both ways, and torch.compile's prefixed keys still load.
    plain = Tagger()
    plain.load_state_dict(compiled.state_dict())
    compiled.load_state_dict(Tagger().state_dict())
    compiled.load_state_dict({f"_orig_mod.{k}": v for k, v in plain.state_dict().items()})
    assert all(torch.equal(a, b) for a, b in zip(compiled.state_dict().values(), plain.state_dict().values()))
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "embed.weight"'):
        compiled.load_state_dict({})
    # Held inside another module (a LightningModule's attribute), the keys are the plain model's too.
    assert list(nn.Sequential(compiled).state_dict()) == list(nn.Sequential(model).state_dict())


# Hugging Face Trainer ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf() -> dict[str, Any]:
    """A tiny GPT-2 (no dropout: losses compare exactly), its data, eager's logged losses and a binding budget."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 64, (2 * STEPS, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]

    def model() -> nn.Module:
        transformers.set_seed(0)
        return transformers.GPT2LMHeadModel(config)

    probe = model()
    report = remat.plan(lambda x: probe(input_ids=x, labels=x).loss, ids[:2], **FAST)
    return {"transformers": transformers, "model": model, "data": data, "budget_gb": report.budget_at(BINDING) / GIB}


def hf_losses(hf: dict[str, Any], model: nn.Module, output_dir: Path, callbacks: list[Any] | None = None) -> list[float]:
    transformers = hf["transformers"]
    args = transformers.TrainingArguments(output_dir=str(output_dir), max_steps=STEPS, per_device_train_batch_size=2,
                                          logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
                                          disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=hf["data"], callbacks=callbacks)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.fixture(scope="module")
def hf_eager(hf: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    losses = hf_losses(hf, hf["model"](), tmp_path_factory.mktemp("eager"))
    assert len(losses) == STEPS
    return losses


def test_hf_trainer_takes_a_remat_compiled_model(hf: dict[str, Any], hf_eager: list[float], tmp_path: Path) -> None:
    """Trainer's default remove_unused_columns=True keeps input_ids and labels: the signature is the model's."""
    compiled = remat.compile(hf["model"](), budget_gb=hf["budget_gb"], **FAST)
    assert hf_losses(hf, compiled, tmp_path) == pytest.approx(hf_eager, rel=1e-6)
    assert_binds(remat.reports(compiled), hf["budget_gb"])


def test_hf_trainer_compiles_with_the_remat_callback(hf: dict[str, Any], hf_eager: list[float],
                                                     tmp_path: Path) -> None:
    from remat.integrations.hf import RematCallback

    model = hf["model"]()
    callback = RematCallback(budget_gb=hf["budget_gb"], **FAST)
    assert hf_losses(hf, model, tmp_path, callbacks=[callback]) == pytest.approx(hf_eager, rel=1e-6)
    assert_binds(callback.reports(), hf["budget_gb"])
    assert remat.reports(model) == callback.reports()
    assert isinstance(model, hf["transformers"].GPT2LMHeadModel)  # compiled in place: save_pretrained still works


def test_hf_callback_names_unknown_options() -> None:
    pytest.importorskip("transformers")
    from remat.integrations.hf import RematCallback

    with pytest.raises(TypeError, match=r"unknown option\(s\) \['budget'\]"):
        RematCallback(budget=2.0)


# accelerate and Lightning: a loss computed outside the model -----------------------------------------


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128),
                         nn.Tanh(), nn.Linear(128, 4))


@pytest.fixture(scope="module")
def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS * ROWS, 16, generator=generator), torch.randint(0, 4, (STEPS * ROWS,), generator=generator)
    return list(zip(x, y))


@pytest.fixture(scope="module")
def mlp_budget_gb(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    inputs = torch.stack([x for x, _ in batches[:ROWS]])
    return remat.plan(mlp(), inputs, **FAST).budget_at(BINDING) / GIB


def accelerate_losses(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(batches, batch_size=ROWS)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_accelerate_prepares_a_remat_compiled_model(batches: list[tuple[torch.Tensor, torch.Tensor]],
                                                    mlp_budget_gb: float) -> None:
    """accelerate's dynamo plugin takes only its own backend names; prepare keeps a compiled model as it is."""
    pytest.importorskip("accelerate")
    eager = accelerate_losses(mlp(), batches)
    compiled = remat.compile(mlp(), budget_gb=mlp_budget_gb, **FAST)
    assert accelerate_losses(compiled, batches) == pytest.approx(eager, rel=1e-6)
    assert_binds(remat.reports(compiled), mlp_budget_gb)


def lightning_run(net: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], Any]:
    """(losses, module) of a LightningModule around ``net`` trained STEPS steps."""
    lightning = pytest.importorskip("lightning")

    class Classifier(lightning.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net
            self.losses: list[float] = []

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Classifier(net)
    trainer = lightning.Trainer(accelerator="cpu", max_steps=STEPS, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=ROWS))
    return module.losses, module


def test_lightning_trains_a_remat_compiled_submodule(batches: list[tuple[torch.Tensor, torch.Tensor]],
                                                     mlp_budget_gb: float) -> None:
    pytest.importorskip("lightning")
    eager, plain = lightning_run(mlp(), batches)
    compiled = remat.compile(mlp(), budget_gb=mlp_budget_gb, **FAST)
    losses, module = lightning_run(compiled, batches)
    assert len(losses) == STEPS and losses == pytest.approx(eager, rel=1e-6)
    assert_binds(remat.reports(compiled), mlp_budget_gb)
    assert list(module.state_dict()) == list(plain.state_dict())  # its checkpoints load into the plain module
