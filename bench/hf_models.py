"""Hugging Face ``transformers`` models built from configs (no downloaded weights), when installed.

Models: GPT-2 (``hf-gpt2``), Llama (``hf-llama``), BERT (``hf-bert``) and the
encoder-decoder T5 (``hf-t5``). Each is wrapped so that ``model(*inputs)`` is the
scalar loss and ``model.blocks`` is its list of layers (what the checkpoint-per-block
peers wrap; T5's: the encoder's blocks, then the decoder's). Dropout is off, as in
the defaults of remat.zoo, so every peer trains the same function.

>>> if available():
...     model, inputs = build("hf-gpt2", layers=1, d_model=32, heads=2, seq=16, vocab=64, batch=2)
...     model(*inputs).backward()
...     t5, inputs = build("hf-t5", layers=1, d_model=32, heads=2, seq=16, vocab=64, batch=2)
...     t5(*inputs).backward()
...     assert len(t5.blocks) == 2  # the encoder's block, then the decoder's
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Inputs = tuple[torch.Tensor, ...]
DEFAULTS = {"layers": 2, "d_model": 64, "heads": 4, "seq": 32, "vocab": 256, "batch": 2}


def available() -> bool:
    """Is ``transformers`` installed (the ``hf`` extra)?"""
    return importlib.util.find_spec("transformers") is not None


class HFLoss(nn.Module):
    """A ``transformers`` model returning its own loss; ``blocks`` are its layers."""

    def __init__(self, hf: nn.Module, blocks: nn.ModuleList) -> None:
        super().__init__()
        self.hf = hf
        self.blocks = blocks

    def forward(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of the wrapped model on token ids ``idx`` with ``labels`` (both (B, T))."""
        return self.hf(input_ids=idx, labels=labels).loss

    def predict(self, idx: torch.Tensor) -> torch.Tensor:
        """The wrapped model's logits (B, T, vocab) on token ids ``idx``."""
        return self.hf(input_ids=idx).logits


class JoinedBlocks(nn.ModuleList):
    """The blocks of several ``nn.ModuleList`` as one list; setting an item sets it in its own list too
    (so that a checkpoint wrapper put on ``blocks[i]`` is the one the model runs)."""

    def __init__(self, *lists: nn.ModuleList) -> None:
        super().__init__([block for blocks in lists for block in blocks])
        self._homes = [(blocks, i) for blocks in lists for i in range(len(blocks))]

    def __setitem__(self, idx: int, module: nn.Module) -> None:  # type: ignore[override]
        super().__setitem__(idx, module)
        home, i = self._homes[idx]
        home[i] = module


def _gpt2(c: dict[str, Any]) -> HFLoss:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=c["layers"], n_embd=c["d_model"], n_head=c["heads"], n_positions=c["seq"],
                     vocab_size=c["vocab"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=c["vocab"] - 1, eos_token_id=c["vocab"] - 1)  # inside small vocabularies
    hf = GPT2LMHeadModel(cfg)
    hf.loss_type = "ForCausalLM"  # the loss it falls back to, without the warning that breaks the graph
    return HFLoss(hf, hf.transformer.h)


def _llama(c: dict[str, Any]) -> HFLoss:
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden = c.get("hidden") or 256 * ((8 * c["d_model"] // 3 + 255) // 256)
    cfg = LlamaConfig(num_hidden_layers=c["layers"], hidden_size=c["d_model"], num_attention_heads=c["heads"],
                      num_key_value_heads=c["heads"], intermediate_size=hidden, vocab_size=c["vocab"],
                      max_position_embeddings=c["seq"], attention_dropout=0.0)
    hf = LlamaForCausalLM(cfg)
    return HFLoss(hf, hf.model.layers)


def _bert(c: dict[str, Any]) -> HFLoss:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(num_hidden_layers=c["layers"], hidden_size=c["d_model"], num_attention_heads=c["heads"],
                     intermediate_size=4 * c["d_model"], vocab_size=c["vocab"], max_position_embeddings=c["seq"],
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf = BertForMaskedLM(cfg)
    return HFLoss(hf, hf.bert.encoder.layer)


def _t5(c: dict[str, Any]) -> HFLoss:
    """Encoder-decoder: ``layers`` blocks each; the labels, shifted right by T5 itself, feed the decoder."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(num_layers=c["layers"], num_decoder_layers=c["layers"], d_model=c["d_model"],
                   num_heads=c["heads"], d_kv=c["d_model"] // c["heads"], d_ff=4 * c["d_model"],
                   vocab_size=c["vocab"], dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                   use_cache=False)  # a training step: no key/value cache in the decoder
    hf = T5ForConditionalGeneration(cfg)
    return HFLoss(hf, JoinedBlocks(hf.encoder.block, hf.decoder.block))


BUILDERS: dict[str, Callable[[dict[str, Any]], HFLoss]] = {"hf-gpt2": _gpt2, "hf-llama": _llama, "hf-bert": _bert,
                                                            "hf-t5": _t5}


def names() -> list[str]:
    """The Hugging Face models, if ``transformers`` is installed (else none)."""
    return list(BUILDERS) if available() else []


def build(name: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
          **overrides: Any) -> tuple[nn.Module, Inputs]:
    """Build ``name`` from a config with ``overrides`` of :data:`DEFAULTS` (plus ``hidden`` for hf-llama)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown Hugging Face model {name!r}; known: {list(BUILDERS)}")
    if not available():
        raise ValueError(f"{name} needs transformers: pip install -e '.[hf]'")
    unknown = sorted(set(overrides) - set(DEFAULTS) - {"hidden"})
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown} for {name}; valid: {[*DEFAULTS, 'hidden']}")
    c = {**DEFAULTS, **overrides}
    torch.manual_seed(seed)
    model = BUILDERS[name](c).to(device=device, dtype=dtype)
    shape = (c["batch"], c["seq"])
    inputs = (torch.randint(c["vocab"], shape).to(device), torch.randint(c["vocab"], shape).to(device))
    return model, inputs


def build_loss_outside(name: str, **overrides: Any) -> Any:
    """``name`` returning its logits, with its token ids, labels and a cross-entropy over them computed
    outside it (``remat.zoo.LossOutside``); ``overrides`` as :func:`build`'s."""
    from remat.models import next_token_loss
    from remat.zoo import LossOutside, Predictor

    model, (idx, labels) = build(name, **overrides)
    return LossOutside(Predictor(model), (idx,), labels, next_token_loss)
