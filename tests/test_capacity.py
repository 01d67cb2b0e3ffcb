"""What fits: planning on the meta device for a named device, and the largest size under a budget."""

from __future__ import annotations

import functools

import pytest
import torch

import remat
from remat import zoo
from remat.passes.devices import DeviceSpec, device_spec


@functools.cache
def cpu_and_meta_plans(name: str) -> tuple[remat.Report, remat.Report]:
    """The same 2-layer model planned on the CPU (analytic profile) and on meta for the "cpu" device."""
    reports = []
    for device in ("cpu", "meta"):
        model, inputs = zoo.build(name, layers=2, device=device)
        options = {"device": "cpu"} if device == "meta" else {"profile": "analytic"}
        reports.append(remat.plan(model, *inputs, compiler="eager", plan_cache=False, **options))
    return reports[0], reports[1]


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_meta_planning_captures_the_graph_the_cpu_does(name: str) -> None:
    cpu, meta = cpu_and_meta_plans(name)
    assert meta.joint_graph_steps == cpu.joint_graph_steps
    assert len(meta.nodes) == len(cpu.nodes)
    assert sum(r.decision == "backward" for r in meta.nodes) == sum(r.decision == "backward" for r in cpu.nodes) > 0
    assert meta.store_all_peak_bytes == pytest.approx(cpu.store_all_peak_bytes, rel=0.01)
    assert meta.min_feasible_bytes == pytest.approx(cpu.min_feasible_bytes, rel=0.01)
    assert meta.min_feasible_bytes <= meta.store_all_peak_bytes
    assert meta.device == "meta:cpu" and any("meta device" in note for note in meta.notes)


def test_a_python_kernels_temporaries_are_counted_on_meta() -> None:
    """prims.fma (Inductor's softmax backward) runs ``(a * b) + c`` in eager: one temporary as large
    as its output. A user's custom op with a Python body counts the same way; an aten op is unknown."""
    from remat.passes.torch_adapter import python_kernel_scratch

    a, row = torch.empty(4, 8, device="meta"), torch.empty(8, device="meta")
    assert python_kernel_scratch(torch.ops.prims.fma.default, (a, row, row), {}) == 4 * 8 * 4
    assert python_kernel_scratch(torch.ops.aten.mul.Tensor, (a, a), {}) is None

    @torch.library.custom_op("remat_test::two_temporaries", mutates_args=())
    def two_temporaries(x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        z = y * 2  # y and z alive together
        del y
        return z.sin() + x.view(-1).view(x.shape)  # z and z.sin() alive with the output; views hold nothing

    assert python_kernel_scratch(two_temporaries._opoverload, (a,), {}) == 2 * 4 * 8 * 4


def test_meta_planning_counts_what_the_cpu_measures_of_softmaxs_backward() -> None:
    """An explicit softmax's backward under the eager compiler (Inductor's decomposition: prims.fma):
    its scratch was measured on the CPU and missing on meta, whose smallest feasible budget came out
    2.4 % low (bench.fit_check's gpt-softmax by sequence found one size too many)."""
    reports = []
    for device in ("cpu", "meta"):
        model, inputs = zoo.build("gpt-softmax", layers=1, batch=4, seq=64, device=device)
        reports.append(remat.plan(model, *inputs, compiler="eager", plan_cache=False,
                                  **({"device": "cpu"} if device == "meta" else {})))
    cpu, meta = reports
    fma = [r for r in meta.nodes if r.op == "prims.fma.default"]
    assert fma and all(r.workspace == r.bytes > 0 for r in fma)
    assert meta.min_feasible_bytes == pytest.approx(cpu.min_feasible_bytes, rel=0.01)


def test_a_size_captured_after_others_is_costed_at_its_own_size() -> None:
    """From its second size on, dynamo captures a model with a symbolic sequence length. Its ops
    were costed from entries keyed by the size's name (``s0``), made at the size planned before:
    remat.fit's search on meta got a smaller op scratch than the size has, and one size too many."""
    def plan(seq: int) -> remat.Report:
        model, inputs = zoo.build("gpt-softmax", layers=1, batch=2, seq=seq, device="meta")
        return remat.plan(model, *inputs, device="cpu", compiler="eager", plan_cache=False)

    plan(32), plan(48)
    late = plan(64)
    torch._dynamo.reset()
    fresh = plan(64)
    assert len(late.nodes) > len(fresh.nodes)  # the late capture is the symbolic one (its size nodes)
    scratch = {r.name: (r.workspace, r.seconds) for r in fresh.nodes if r.op == "prims.fma.default"}
    assert scratch and scratch == {r.name: (r.workspace, r.seconds) for r in late.nodes if r.name in scratch}
    assert late.min_feasible_bytes == fresh.min_feasible_bytes


def test_attention_on_meta_takes_the_named_device_kernel() -> None:
    model, inputs = zoo.build("llama", layers=1, device="meta", dtype=torch.bfloat16)
    ops = {row.op for row in remat.plan(model, *inputs, device="h100-80gb", compiler="eager").nodes}
    assert "aten._scaled_dot_product_flash_attention.default" in ops
    assert not any("flash_attention_for_cpu" in op for op in ops)


def test_costs_for_a_named_device_leave_the_measured_cost_table_writable(tmp_path) -> None:
    # analytic costs for a DeviceSpec share the process's timing cache with measured ones: a later
    # measured plan writes its cost table (JSON) without them
    meta_model, meta_inputs = zoo.build("mlp-dropout", device="meta")
    remat.plan(meta_model, *meta_inputs, device=DeviceSpec(flops=1e14, bandwidth=1e12, memory_bytes=2**34),
               compiler="eager")
    model, inputs = zoo.build("mlp-dropout")
    remat.plan(model, *inputs, compiler="eager", plan_cache=str(tmp_path))
    assert list((tmp_path / "costs").iterdir())


def test_a_data_dependent_branch_on_meta_is_refused_naming_it() -> None:
    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            if y.sum().item() > 0:
                y = y * 2
            return y.sum()

    with pytest.raises(remat.GraphError, match=r"one graph.*y.sum\(\).item\(\) > 0"):
        remat.plan(Branchy().to("meta"), torch.randn(4, 8, device="meta"), device="h100-80gb")


def test_device_is_for_meta_models_and_named_ones() -> None:
    model, inputs = zoo.build("mlp-dropout")
    with pytest.raises(ValueError, match="meta device"):
        remat.plan(model, *inputs, device="h100-80gb")
    meta_model, meta_inputs = zoo.build("mlp-dropout", device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="autocast does not reach"):
        remat.plan(meta_model, *meta_inputs, device="h100-80gb")
    with pytest.raises(ValueError, match="unknown device 'h900'"):
        device_spec("h900")
    with pytest.raises(ValueError, match="positive"):
        DeviceSpec(flops=0, bandwidth=1e12, memory_bytes=2**30)


TINY_GPT = {"layers": 1, "d_model": 32, "heads": 4, "vocab": 64}


def tiny_gpt(device: str, batch: int = 4, seq: int = 16) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The tiny GPT and its tokens at ``batch`` and ``seq`` (its position table sized by ``seq``)."""
    with torch.device(device):
        return zoo.build("gpt", device=device, batch=batch, seq=seq, **TINY_GPT)


def test_meta_planning_under_inductor_accounts_for_the_program_the_cpu_compiles() -> None:
    """For the CPU, Inductor's program is generated for fake inputs (nothing run) and judged as on the
    CPU: the same compiled peak and smallest feasible budget as the CPU's own compile, both with
    analytic costs (which pick the same plans). For a GPU the figures stay the FX-level model's."""
    reports = []
    for device, options in (("cpu", {"profile": "analytic"}), ("meta", {"device": "cpu"})):
        model, inputs = tiny_gpt(device)
        reports.append(remat.plan(model, *inputs, budget_gb=250_000 / 2**30, plan_cache=False, **options))
    cpu, meta = reports
    assert cpu.min_feasible_bytes < 250_000 < cpu.store_all_peak_bytes  # a budget that binds
    assert meta.compiled_peak_bytes is not None and meta.compiled_peak_bytes == cpu.compiled_peak_bytes
    assert meta.compiled_peak_bytes <= meta.budget_bytes
    assert meta.min_feasible_exact and meta.min_feasible_bytes == cpu.min_feasible_bytes
    assert any("the program Inductor generates" in note for note in meta.notes)

    model, inputs = tiny_gpt("meta")
    gpu = remat.plan(model, *inputs, budget_gb=250_000 / 2**30, device="h100-80gb")
    assert gpu.compiled_peak_bytes is None and not gpu.min_feasible_exact
    assert any("none is accounted for" in note for note in gpu.notes)


@pytest.mark.parametrize(("vary", "low", "tried"), [("batch", 4, [4, 8, 6, 5]), ("seq", 16, [16, 32, 24, 20, 22, 23])])
def test_the_size_fit_predicts_on_meta_is_the_largest_that_runs_on_the_cpu(vary: str, low: int,
                                                                              tried: list[int]) -> None:
    from remat.measure import budget_peak

    def at(size: int, device: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        return tiny_gpt(device, **{vary: size})

    # a budget just below what the last size tried needs: the one before it is the largest that fits
    model, inputs = at(tried[-1] + 1, "meta")
    refused = remat.plan(model, *inputs, device="cpu", compiler="eager")
    budget_gb = (refused.min_feasible_bytes - 512) / 2**30
    found = remat.fit(lambda n: at(n, "meta")[0], lambda n: at(n, "meta")[1], budget_gb=budget_gb, vary=vary,
                      low=low, device="cpu", compiler="eager")
    assert found.size == tried[-1] and found.captured == tried
    assert [p.fits for p in found.curve] == [p.size <= found.size for p in found.curve]
    assert found.report.predicted_peak_bytes <= found.report.budget_bytes
    assert all(p.store_all_peak_bytes >= p.min_feasible_bytes for p in found.curve)
    assert found.device == "meta:cpu" and f"| {found.size} | yes |" in found.to_markdown()

    model, inputs = at(found.size, "cpu")
    compiled = remat.compile(model, budget_gb=budget_gb, compiler="eager", plan_cache=False)
    assert budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cpu") <= found.report.budget_bytes
    model, inputs = at(found.size + 1, "cpu")
    with pytest.raises(remat.BudgetError):
        remat.compile(model, budget_gb=budget_gb, compiler="eager", plan_cache=False)(*inputs).backward()


def test_under_inductor_the_size_fit_finds_on_meta_is_the_one_the_cpu_compiles() -> None:
    """Under Inductor fit compiles each size under the budget, captured at that size alone (a
    symbolic capture's program is not the one a loop at one size compiles): the batch it finds on meta
    runs within the budget on the CPU and the next is refused, as remat.compile decides them with the
    same (analytic) costs. (With measured costs the CPU may pick another plan near the boundary, whose
    program can peak a few KB apart: the bench's fit_check measures that case.)"""
    from remat.measure import budget_peak

    model, inputs = tiny_gpt("meta", batch=7)
    budget_gb = (remat.plan(model, *inputs, device="cpu").min_feasible_bytes - 512) / 2**30
    found = remat.fit(lambda n: tiny_gpt("meta", batch=n)[0], lambda n: tiny_gpt("meta", batch=n)[1],
                      budget_gb=budget_gb, vary="batch", low=5, high=7, device="cpu")
    assert found.captured[:2] == [5, 7] and found.report.compiled_peak_bytes <= found.report.budget_bytes
    assert all(p.fits == (p.size <= found.size) for p in found.curve)

    model, inputs = tiny_gpt("cpu", batch=found.size)
    compiled = remat.compile(model, budget_gb=budget_gb, plan_cache=False, profile="analytic")
    assert budget_peak(lambda: compiled(*inputs).backward(), model, inputs, "cpu") <= found.report.budget_bytes
    if found.size < 7:
        model, inputs = tiny_gpt("cpu", batch=found.size + 1)
        with pytest.raises(remat.BudgetError):
            remat.compile(model, budget_gb=budget_gb, plan_cache=False, profile="analytic")(*inputs).backward()


def test_a_meta_model_compiled_to_run_runs_on_meta() -> None:
    """Only planning hands Inductor fake CPU inputs: a program compiled for them and called with meta
    tensors would read storage that is not there (the process crashed)."""
    model, inputs = tiny_gpt("meta", batch=2)
    loss = remat.compile(model, budget_gb=0.001)(*inputs)
    loss.backward()
    assert loss.device.type == "meta" and all(p.grad is not None for p in model.parameters())


def test_fit_refuses_what_it_cannot_search() -> None:
    model = tiny_gpt("meta")[0]

    def tokens(batch: int) -> tuple[torch.Tensor, ...]:
        return tiny_gpt("meta", batch=batch)[1]

    with pytest.raises(ValueError, match="vary"):
        remat.fit(model, tokens, budget_gb=1, vary="width")
    with pytest.raises(ValueError, match="budget"):
        remat.fit(model, tokens, budget_gb=None)
    with pytest.raises(remat.BudgetError, match="batch=1 does not fit"):
        remat.fit(model, tokens, budget_gb=1e-6, device="cpu", compiler="eager")


def test_remat_fit_on_the_command_line(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from remat import cli

    argv = ["fit", "mlp-dropout", "--budget-gb", "1", "--device", "a100-40gb", "--low", "8", "--high", "16",
            "--compiler", "eager", "--json", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["size"] == 16 and found["captured"] == [8, 16] and found["device"] == "meta:a100-40gb"
    assert (tmp_path / "fit.md").read_text().startswith("| batch | fits |")
    assert cli.main(["fit", "--vary", "seq"]) == 2
    assert "name a built-in model" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["remat.capacity", "remat.passes.devices", "bench.capacity"])
def test_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("shape", ["7b", "70b"])
def test_the_bench_plans_one_layer_of_each_shape_on_meta(shape: str) -> None:
    from bench import capacity

    row = capacity.run(1, "h100-80gb", 80.0, 30.0, shape)
    model, _ = capacity.meta_llama(**{**capacity.SHAPES[shape], "layers": 1})
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert row["device"] == "meta:h100-80gb" and row["steps"] > 0 and row["weights"] == weights
    assert row["store_all"] >= 2 * weights  # parameters and their gradients, at the least
    assert row["min_feasible"] <= row["at_budget"] <= 80 * 2**30
    assert "| planner's peak RSS |" in capacity.markdown(row, "python -m bench.capacity --layers 1")


def test_the_gpu_check_compares_what_meta_planning_promises() -> None:
    from bench.capacity_gpu import compare

    cpu, meta = cpu_and_meta_plans("llama")
    rows = compare(meta, cpu)
    assert [name for name, *_ in rows] == ["joint-graph nodes", "backward nodes", "attention kernel",
                                           "store-all peak", "smallest feasible peak"]
    assert all(same for *_, same in rows), rows
    assert "flash_attention" in rows[2][1]
    assert not all(same for *_, same in compare(meta, cpu_and_meta_plans("gpt")[0]))
