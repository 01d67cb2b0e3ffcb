"""The bench models by name (the zoo's and Hugging Face ones) and the sizes ``python -m bench`` runs them at."""

from __future__ import annotations

from typing import Any

import torch

from bench import hf_models
from remat.zoo import build as build_zoo

ZOO = ("gpt", "gpt-softmax", "llama", "convnet", "vit")
SDPA_MODELS = ("gpt", "llama", "vit", "hf-gpt2", "hf-llama", "hf-bert")
_GPT_CUDA = {"layers": 12, "d_model": 1024, "heads": 16, "seq": 2048, "vocab": 32000, "batch": 8}
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "cuda": {
        "gpt": _GPT_CUDA, "gpt-softmax": {**_GPT_CUDA, "batch": 4}, "llama": {**_GPT_CUDA, "hidden": 2816},
        "convnet": {"channels": 128, "blocks": 8, "image": 128, "batch": 64},
        "vit": {"layers": 12, "d_model": 768, "heads": 12, "patch": 16, "image": 224, "batch": 64},
        "hf-gpt2": {"layers": 12, "d_model": 768, "heads": 12, "seq": 1024, "vocab": 50257, "batch": 8},
        "hf-llama": {**_GPT_CUDA, "hidden": 2816},
        "hf-bert": {"layers": 12, "d_model": 768, "heads": 12, "seq": 512, "vocab": 30522, "batch": 32},
        "hf-t5": {"layers": 12, "d_model": 768, "heads": 12, "seq": 512, "vocab": 32128, "batch": 8},  # T5-base
    },
    "cpu": {
        "gpt": {"layers": 4, "d_model": 256, "heads": 8, "seq": 128, "vocab": 1024, "batch": 4},
        "gpt-softmax": {"layers": 4, "d_model": 256, "heads": 8, "seq": 128, "vocab": 1024, "batch": 4},
        "llama": {"layers": 4, "d_model": 256, "heads": 8, "seq": 256, "vocab": 1024, "batch": 4, "hidden": 688},
        "convnet": {"channels": 32, "blocks": 4, "image": 32, "batch": 16},
        "vit": {"layers": 4, "d_model": 256, "heads": 8, "patch": 8, "image": 64, "batch": 16},
        "hf-gpt2": {"layers": 4, "d_model": 256, "heads": 8, "seq": 256, "vocab": 1024, "batch": 4},
        "hf-llama": {"layers": 4, "d_model": 256, "heads": 8, "seq": 256, "vocab": 1024, "batch": 4},
        "hf-bert": {"layers": 4, "d_model": 256, "heads": 8, "seq": 256, "vocab": 1024, "batch": 4},
        "hf-t5": {"layers": 2, "d_model": 256, "heads": 8, "seq": 256, "vocab": 1024, "batch": 4},
    },
    "smoke": {
        "gpt": {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "vocab": 256, "batch": 4},
        "gpt-softmax": {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "vocab": 256, "batch": 4},
        "llama": {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "vocab": 256, "batch": 4},
    },
}


def default_models() -> list[str]:
    return [*ZOO, *hf_models.names()]


def build(name: str, device: str, size: dict[str, Any]) -> tuple[torch.nn.Module, tuple]:
    if name.startswith("hf-"):
        return hf_models.build(name, device=device, **size)
    return build_zoo(name, device=device, **size)
