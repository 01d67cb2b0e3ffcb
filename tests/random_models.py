"""Small random training models drawn from a menu, one per seed.

``draw(seed)`` gives a :class:`Case`: the model's spec (family, blocks,
sizes, autocast), how to compile it (compiler, profile) and where its budget
sits between the smallest feasible and store-all. The same seed always
gives the same case, so a failing case is rerun by its seed alone::

    python -m tests.random_models 137      # prints the case and runs it

The menu: Linear, Conv2d, LayerNorm, BatchNorm (training mode), Dropout,
GELU/SiLU, residual adds, SDPA and explicit softmax attention, views,
reshapes, transposes, in-place ops on activations, buffers mutated in the
forward, and bf16 autocast.
"""

from __future__ import annotations

import copy
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import remat
from remat.errors import GIB
from remat.measure import budget_peak
from remat.passes import torch_adapter as adapter

SEQ_BLOCKS = ("linear", "mlp", "layernorm", "batchnorm", "dropout", "act", "sdpa", "attention",
              "reshape", "inplace", "buffer")
CONV_BLOCKS = ("conv", "conv-res", "batchnorm", "dropout", "act", "inplace", "buffer", "tokens", "sdpa")


@dataclass(frozen=True)
class Spec:
    """What the model is made of."""

    family: str  # "seq": x is (batch, tokens, width); "conv": x is (batch, channels, h, w)
    blocks: tuple[str, ...]
    batch: int
    tokens: int  # seq length, or image side for "conv"
    width: int  # model width, or channels for "conv"
    heads: int
    dropout: float
    act: str  # "gelu" | "silu"
    inplace: str  # "relu_" | "mul_" | "add_"
    autocast: bool
    extra_output: bool  # return (loss, features) instead of the loss alone


@dataclass(frozen=True)
class Case:
    seed: int
    spec: Spec
    compiler: str  # "eager" | "inductor"
    profile: str  # "analytic" | "measure"
    fraction: float  # where the budget sits: 0 = smallest feasible, 1 = store-all

    def __str__(self) -> str:
        return (f"case-{self.seed}: {self.compiler}/{self.profile} budget at {self.fraction:.3f} "
                f"{self.spec}")


def draw(seed: int, *, inductor: bool = False) -> Case:
    """The case for ``seed``; ``inductor`` compiles it with Inductor (else op by op)."""
    rng = random.Random(seed)
    family = rng.choice(("seq", "seq", "conv"))
    menu = SEQ_BLOCKS if family == "seq" else CONV_BLOCKS
    blocks = tuple(rng.choice(menu) for _ in range(rng.randint(1, 5)))
    # few distinct sizes: op timings are cached by shape, so most cases measure nothing new
    spec = Spec(
        family=family,
        blocks=blocks,
        batch=rng.choice((4, 8)),
        tokens=rng.choice((8, 16)) if family == "seq" else rng.choice((6, 8)),
        width=rng.choice((16, 32)) if family == "seq" else 8,
        heads=rng.choice((1, 2)),
        dropout=rng.choice((0.1, 0.5)),
        act=rng.choice(("gelu", "silu")),
        inplace=rng.choice(("relu_", "mul_", "add_")),
        autocast=rng.random() < 0.25,
        extra_output=rng.random() < 0.2,
    )
    u = rng.random()
    fraction = 0.0 if u < 0.15 else 1.0 if u > 0.9 else rng.random()
    return Case(seed, spec, "inductor" if inductor else "eager",
                "measure", fraction)


# --------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------


def activation(name: str) -> nn.Module:
    return nn.GELU() if name == "gelu" else nn.SiLU()


def in_place(x: torch.Tensor, how: str) -> torch.Tensor:
    """An in-place op on a fresh activation (one nothing has read yet)."""
    if how == "relu_":
        return x.relu_()
    if how == "mul_":
        return x.mul_(0.5)
    return x.add_(1.0)


class Linear(nn.Module):
    def __init__(self, s: Spec) -> None:
        super().__init__()
        self.fc = nn.Linear(s.width, s.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class MLP(nn.Module):
    """Residual MLP."""

    def __init__(self, s: Spec) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(s.width, 2 * s.width), activation(s.act), nn.Linear(2 * s.width, s.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class InPlace(nn.Module):
    """A projection (linear or conv) followed by an in-place op on its output."""

    def __init__(self, s: Spec) -> None:
        super().__init__()
        self.how = s.inplace
        self.proj = nn.Linear(s.width, s.width) if s.family == "seq" else nn.Conv2d(s.width, s.width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return in_place(self.proj(x), self.how)


class BatchNorm(nn.Module):
    """BatchNorm over the width; sequences go through a transpose and back.

    The transposed input is made contiguous: on a transposed input the CPU
    kernel returns another layout than its fake kernel traces, so a dropout
    after it would draw its mask in another memory order than eager's (a
    valid mask, but not eager's; ``test_batchnorm_on_a_transposed_input_runs_op_by_op``
    covers that layout itself).
    """

    def __init__(self, s: Spec) -> None:
        super().__init__()
        self.seq = s.family == "seq"
        self.bn = nn.BatchNorm1d(s.width) if self.seq else nn.BatchNorm2d(s.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x.transpose(1, 2).contiguous()).transpose(1, 2) if self.seq else self.bn(x)


class Buffer(nn.Module):
    """A running mean of the input and a call counter, both updated in the forward."""

    def __init__(self, s: Spec) -> None:
        super().__init__()
        self.dims = (0, 1) if s.family == "seq" else (0, 2, 3)
        self.register_buffer("ema", torch.zeros(s.width))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ema.mul_(0.9).add_(0.1 * x.detach().float().mean(self.dims))
        self.calls.add_(1)
        scale = 1 + self.ema.tanh()
        return x * (scale if x.dim() == 3 else scale[:, None, None])


class Attention(nn.Module):
    """Residual self-attention over tokens: SDPA or explicit softmax (with dropout)."""

    def __init__(self, s: Spec, *, fused: bool) -> None:
        super().__init__()
        self.heads = s.heads if s.width % s.heads == 0 else 1
        self.fused, self.p = fused, s.dropout
        self.qkv, self.out = nn.Linear(s.width, 3 * s.width), nn.Linear(s.width, s.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            y = F.dropout(scores.softmax(-1), self.p, self.training) @ v
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


class Reshape(nn.Module):
    """Views and reshapes that permute the width, then a projection."""

    def __init__(self, s: Spec) -> None:
        super().__init__()
        self.fc = nn.Linear(s.width, s.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        y = x.view(b, t, 2, d // 2).transpose(2, 3).reshape(b, t * d)
        return self.fc(y.view(b, t, d).contiguous().flatten(0, 1)).unflatten(0, (b, t))


class Conv(nn.Module):
    def __init__(self, s: Spec, *, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.conv = nn.Conv2d(s.width, s.width, 3, padding=1)
        self.body = nn.Sequential(activation(s.act), nn.Conv2d(s.width, s.width, 3, padding=1)) if residual else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return x + self.body(y) if self.body is not None else y


class Tokens(nn.Module):
    """An image as tokens: flatten, transpose, LayerNorm (or attention), and back."""

    def __init__(self, s: Spec, *, attend: bool) -> None:
        super().__init__()
        self.inner = Attention(s, fused=True) if attend else nn.LayerNorm(s.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.inner(x.flatten(2).transpose(1, 2))
        return y.transpose(1, 2).reshape(b, c, h, w)


def block(name: str, s: Spec) -> nn.Module:
    seq = s.family == "seq"
    makers = {
        "linear": lambda: Linear(s),
        "mlp": lambda: MLP(s),
        "layernorm": lambda: nn.LayerNorm(s.width),
        "batchnorm": lambda: BatchNorm(s),
        "dropout": lambda: nn.Dropout(s.dropout),
        "act": lambda: activation(s.act),
        "sdpa": lambda: Attention(s, fused=True) if seq else Tokens(s, attend=True),
        "attention": lambda: Attention(s, fused=False),
        "reshape": lambda: Reshape(s),
        "inplace": lambda: InPlace(s),
        "buffer": lambda: Buffer(s),
        "conv": lambda: Conv(s, residual=False),
        "conv-res": lambda: Conv(s, residual=True),
        "tokens": lambda: Tokens(s, attend=False),
    }
    return makers[name]()


class RandomModel(nn.Module):
    """The blocks of ``spec`` in a row, a linear head and a mean-square loss."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.spec = spec
        self.stem = nn.Linear(spec.width, spec.width) if spec.family == "seq" else nn.Conv2d(3, spec.width, 3, padding=1)
        self.blocks = nn.ModuleList(block(name, spec) for name in spec.blocks)
        self.head = nn.Linear(spec.width, 4)

    def forward(self, x: torch.Tensor) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.spec.autocast):
            h = self.stem(x)
            for b in self.blocks:
                h = b(h)
            features = h if self.spec.family == "seq" else h.mean((2, 3))
            logits = self.head(features)
        loss = logits.float().square().mean()
        return (loss, logits) if self.spec.extra_output else loss


def build(spec: Spec, seed: int) -> tuple[RandomModel, torch.Tensor]:
    torch.manual_seed(seed)
    model = RandomModel(spec)
    shape = ((spec.batch, spec.tokens, spec.width) if spec.family == "seq"
             else (spec.batch, 3, spec.tokens, spec.tokens))
    return model, torch.randn(shape)


# --------------------------------------------------------------------------
# Running a case
# --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one case measured; ``problems`` is empty when it passed."""

    case: Case
    budget_bytes: int = 0
    predicted_peak_bytes: int = 0
    measured_peak_bytes: int = 0
    recomputed: int = 0
    problems: list[str] = field(default_factory=list)


def step(fn: Any, model: nn.Module, x: torch.Tensor, seed: int) -> tuple[list[torch.Tensor], dict, dict]:
    """One training step; (outputs, grads, buffers) read afterwards."""
    torch.manual_seed(seed)
    out = fn(x)
    outs = list(out) if isinstance(out, tuple) else [out]
    outs[0].backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    return [o.detach().clone() for o in outs], grads, buffers


def tolerances(spec: Spec) -> dict[str, float]:
    # bf16 autocast (8 bits of mantissa): torch's decompositions round in other
    # places than eager's kernels; atol is scaled by each tensor's largest value
    return {"atol": 5e-2, "rtol": 5e-2} if spec.autocast else {"atol": 1e-5, "rtol": 1e-4}


def differences(expected: dict | list, actual: dict | list, what: str, tol: dict[str, float]) -> list[str]:
    if isinstance(expected, list):
        expected, actual = dict(enumerate(expected)), dict(enumerate(actual))
    if expected.keys() != actual.keys():
        return [f"{what}: keys differ {sorted(expected)} vs {sorted(actual)}"]
    found = []
    for key in expected:
        scale = expected[key].abs().max().item() if expected[key].is_floating_point() and expected[key].numel() else 1.0
        try:
            torch.testing.assert_close(actual[key], expected[key], atol=tol["atol"] * max(scale, 1.0), rtol=tol["rtol"])
        except AssertionError as exc:
            found.append(f"{what} {key}: {str(exc).splitlines()[0:4]}")
    return found


def budget_at(report: remat.Report, fraction: float) -> float:
    return math.ceil(report.budget_at(fraction)) / GIB


def run(case: Case, *, measure_peak: bool = True) -> Outcome:
    """Run ``case`` against eager; raises nothing a plan or step raises (it goes in ``problems``)."""
    outcome = Outcome(case)
    spec = case.spec
    model, x = build(spec, case.seed)
    reference = copy.deepcopy(model)
    expected = step(reference, reference, x, case.seed)
    tol = tolerances(spec)
    adapter.reset_compiled()
    with randomness(case):
        top = remat.plan(model, x, compiler=case.compiler, profile=case.profile)
        budget = budget_at(top, case.fraction)
        adapter.reset_compiled()
        compiled = remat.compile(model, budget_gb=budget, compiler=case.compiler, profile=case.profile)
        actual = step(compiled, model, x, case.seed)
    for what, e, a in zip(("output", "grad", "buffer"), expected, actual):
        outcome.problems += differences(e, a, what, tol)
    reports = remat.reports(compiled)
    if len(reports) != 1:
        outcome.problems.append(f"{len(reports)} reports for one graph")
    report = reports[0]
    outcome.budget_bytes, outcome.predicted_peak_bytes = report.budget_bytes, report.predicted_peak_bytes
    outcome.recomputed = len(report.recomputed)
    if not report.checked_peak_bytes <= report.planned_budget_bytes <= report.budget_bytes:
        outcome.problems.append(f"checked peak {report.checked_peak_bytes} over the planned budget "
                                f"{report.planned_budget_bytes} (budget {report.budget_bytes})")
    if measure_peak:
        model.zero_grad(set_to_none=True)  # the gradients the step produces count
        outs = []
        with randomness(case):
            peak = budget_peak(lambda: outs.append(step_backward(compiled, x)), model, (x,), "cpu")
        outs.clear()
        outcome.measured_peak_bytes = peak
        if outcome.measured_peak_bytes > report.budget_bytes:
            outcome.problems.append(f"measured peak {outcome.measured_peak_bytes} over the budget "
                                    f"{report.budget_bytes} (predicted {report.predicted_peak_bytes})")
    adapter.reset_compiled()
    return outcome


def randomness(case: Case) -> Any:
    """Both compilers decompose like Inductor: dropout draws its masks with
    aten's random ops, as eager does, only under ``fallback_random``."""
    return adapter.inductor_settings(fallback_random=True)  # dropout masks equal eager's


def step_backward(compiled: Any, x: torch.Tensor) -> None:
    out = compiled(x)
    (out[0] if isinstance(out, tuple) else out).backward()


def main(argv: list[str]) -> int:
    inductor = "--inductor" in argv
    seeds = [int(a) for a in argv if not a.startswith("--")]
    failed = 0
    for seed in seeds:
        case = draw(seed, inductor=inductor)
        outcome = run(case)
        status = "FAIL" if outcome.problems else "ok"
        failed += bool(outcome.problems)
        print(f"{status} {case}\n  budget {outcome.budget_bytes} predicted {outcome.predicted_peak_bytes} "
              f"measured {outcome.measured_peak_bytes} recomputed {outcome.recomputed}")
        for p in outcome.problems:
            print("  -", p)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
