"""The account of Inductor's generated program against the step's measured peak (CPU)."""

from __future__ import annotations

import pytest
import torch

import remat
from remat import zoo
from remat.measure import budget_peak
from bench import hf_models, refusal
from remat.passes.program import fit
from remat.passes.modeling import problem
from remat.passes.program.fit import compile_once
from remat.passes.program.known_programs import KNOWN
from remat.passes.program import inductor_account as account
from remat.passes import torch_adapter as adapter
from remat.errors import GIB
from tests.conftest import planned

TINY = {"layers": 1, "d_model": 32, "heads": 4, "seq": 16, "vocab": 64, "batch": 4}
SIZES = {"gpt": TINY, "gpt-softmax": TINY, "llama": TINY, "convnet": {"channels": 8, "blocks": 1, "image": 16,
                                                                       "batch": 4},
         "mlp-dropout": {"batch": 64}}
# Scratch inside aten.convolution_backward that no wrapper line shows (15,296 B measured at this size).
CONV_SCRATCH = 16 * 1024


def measured_peak(model: torch.nn.Module, run, inputs: tuple) -> int:
    model.zero_grad(set_to_none=True)
    return budget_peak(lambda: run(*inputs).backward(), model, inputs, "cpu")


def measured_with_traced(model: torch.nn.Module, compiled, inputs: tuple) -> int:
    """A step after the one that compiled, as the budget counts it: what torch's tracing allocated then and
    keeps for the graph (``Report.traced_bytes``, counted as the graph's state) is already there."""
    return measured_peak(model, compiled, inputs) + sum(r.traced_bytes for r in remat.reports(compiled))


def account_of_default_compile(name: str, reuse: bool) -> tuple[int, int, account.StepAccount]:
    model, inputs = zoo.build(name, **SIZES[name])
    compiled = torch.compile(model)
    with torch._inductor.config.patch(allow_buffer_reuse=reuse), account.capture_programs() as programs:
        compiled(*inputs).backward()
    step = account.step_account(programs)
    return measured_peak(model, compiled, inputs), step.peak_bytes, step


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("name", ["gpt", "gpt-softmax", "llama"])
def test_account_equals_the_measured_peak_to_the_byte(name: str, reuse: bool) -> None:
    measured, accounted, step = account_of_default_compile(name, reuse)
    assert step.complete, step.incomplete_reason
    assert accounted == measured, (accounted, measured, step.peak_at)


def test_conv_account_misses_only_kernel_scratch() -> None:
    measured, accounted, _ = account_of_default_compile("convnet", True)
    assert 0 <= measured - accounted <= CONV_SCRATCH


def test_an_unknown_line_kind_makes_the_account_incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    real = adapter.memory_event

    def event(line):
        kind, what = real(line)
        return ("unknown", "FutureLine") if kind == "events" and what and what[0][0] == "alloc" else (kind, what)

    monkeypatch.setattr(adapter, "memory_event", event)
    _, _, step = account_of_default_compile("gpt", True)
    assert not step.complete and "FutureLine" in step.incomplete_reason


def test_a_capture_that_sees_no_program_fails_loudly() -> None:
    with account.capture_programs() as programs:
        pass
    with pytest.raises(RuntimeError, match="expected one forward and one backward"):
        account.step_account(programs)


@pytest.mark.parametrize("name", ["gpt", "gpt-softmax", "llama", "convnet", "mlp-dropout"])
def test_remat_under_inductor_fits_the_budget_by_its_compiled_account(name: str) -> None:
    model, inputs = zoo.build(name, **SIZES[name])
    top = planned(name, "inductor", **SIZES[name])
    assert top.compiled_peak_bytes is not None and top.min_feasible_exact
    torch._dynamo.reset()
    budget = top.budget_at(0.3)
    compiled = remat.compile(model, budget_gb=budget / GIB, plan_cache=False)
    compiled(*inputs).backward()
    report = remat.reports(compiled)[0]
    measured = measured_with_traced(model, compiled, inputs)
    assert report.compiled_peak_bytes <= report.planned_budget_bytes
    assert measured <= report.budget_bytes
    # exact on the transformer (SDPA's backward tuple freed with its name), on the conv net,
    # whose convolutions' scratch is measured channels-last, as Inductor lays them out, and on
    # the dropout MLP, whose mask multiply's eager scratch (the bool mask made float) Inductor's
    # generated kernel does not hold
    assert name != "gpt" or report.recomputed  # the backward recomputes: the case the tuple rule fixed
    assert measured == report.compiled_peak_bytes


def test_the_smallest_feasible_budget_from_plan_is_accepted() -> None:
    model, inputs = zoo.build("gpt", **TINY)
    top = planned("gpt", "inductor", **TINY)  # remat.plan's report, shared with the test above
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=top.min_feasible_bytes / GIB, plan_cache=False)
    compiled(*inputs).backward()
    assert measured_peak(model, compiled, inputs) <= remat.reports(compiled)[0].budget_bytes


@pytest.fixture
def programs(monkeypatch) -> list:
    """Every program the fitting loop compiles while the test runs: (callable, plan, peak)."""
    compiled: list = []
    monkeypatch.setattr(fit, "compile_once", lambda *args: compiled.append(compile_once(*args)) or compiled[-1])
    return compiled


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_one_byte_below_the_smallest_feasible_budget_is_refused(name: str) -> None:
    """Under Inductor ``min_feasible_bytes`` is a budget ``remat.compile`` accepts, its program's
    measured peak within it, and one byte less raises ``BudgetError`` naming it. After
    ``remat.plan`` compiled the smallest-peak plan's program, the refusal compiles one program
    more (four before: the smallest-peak program again among them); in a process that compiled
    nothing of the model, at most four (five before on the GPT: the same program peak three times,
    then the fastest plan's, 23 % above): tightened plans while they make headway, the
    smallest-peak plan's, and the fastest plan's only where the model puts it near. (Analytic
    costs, so that every compile plans from the same costs. On the Llama-style model the plan
    accepted at that budget peaks below it: a tightened plan, not one of the two fall-backs.)"""
    model, inputs = zoo.build(name, **SIZES[name])
    options = refusal.OPTIONS  # analytic costs, the plan cache off
    low = remat.plan(model, *inputs, **options).min_feasible_bytes
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=low / GIB, **options)
    compiled(*inputs).backward()
    assert remat.reports(compiled)[0].budget_bytes == low
    assert measured_peak(model, compiled, inputs) <= low
    for known, most in ((True, 1), (False, 4)):  # (python -m bench.refusal measures the same)
        if not known:
            KNOWN.forget()  # as in a process that compiled nothing of the model
        row = refusal.refused(model, inputs, low - 1)
        assert row["budget_bytes"] == low - 1 and row["named_bytes"] == low
        assert row["programs"] <= most, (known, row["program_peaks"])


@pytest.mark.skipif(not hf_models.available(), reason="transformers is not installed")
def test_the_tied_head_gradient_kept_apart_lowers_the_smallest_budget(monkeypatch) -> None:
    """HF GPT-2 ties its LM head to the embedding. Inductor would fold the head's weight gradient
    into the embedding's at the end of the backward (an addmm), holding the logits gradient
    (tokens x vocabulary) through the whole backward; remat keeps the two apart, which lowers the
    smallest feasible budget by about that gradient less the head's (vocabulary x width), and the
    program at it peaks as accounted. (Analytic costs: every compile plans from the same costs.)"""
    sizes = {"layers": 1, "d_model": 32, "heads": 4, "seq": 32, "vocab": 256, "batch": 4}
    model, inputs = hf_models.build("hf-gpt2", **sizes)
    options = {"profile": "analytic", "plan_cache": False}
    low = remat.plan(model, *inputs, **options).min_feasible_bytes
    with monkeypatch.context() as patched:
        patched.setattr(problem, "fold_holds_more", lambda *args: False)
        torch._dynamo.reset()
        folded = remat.plan(model, *inputs, **options).min_feasible_bytes
    tokens, vocab, width = sizes["batch"] * sizes["seq"], sizes["vocab"], sizes["d_model"]
    assert folded - low >= (tokens - width) * vocab * 4 // 2, (folded, low)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=low / GIB, **options)
    compiled(*inputs).backward()
    assert measured_with_traced(model, compiled, inputs) == remat.reports(compiled)[0].compiled_peak_bytes <= low


def test_a_program_far_under_its_target_gets_a_looser_faster_plan(monkeypatch, tmp_path) -> None:
    """The dropout MLP's first plan at half way compiles 14 % under its budget (the model
    over-counts the mask's scratch); the plan asked for that much more fits and is faster, by
    0.2 % of the step: compiled with no least gain asked, not compiled by default (1 %).
    A second process-like compile loads the looser plan and does not loosen again."""
    model, inputs = zoo.build("mlp-dropout", batch=64)
    options = {"profile": "analytic", "plan_cache": False}
    budget = remat.plan(model, *inputs, **options).budget_at(0.5)
    found, under_by_default, gain_by_default = {}, fit.LOOSEN_UNDER, fit.LOOSEN_GAIN
    for under, gain in ((1.0, 0.0), (under_by_default, gain_by_default), (under_by_default, 0.0)):
        monkeypatch.setattr(fit, "LOOSEN_UNDER", under)  # 1.0: never far enough under, the loop as it was
        monkeypatch.setattr(fit, "LOOSEN_GAIN", gain)
        torch._dynamo.reset()
        compiled = remat.compile(model, budget_gb=budget / GIB, **options)
        compiled(*inputs).backward()
        found[gain, under] = (remat.reports(compiled)[0], measured_peak(model, compiled, inputs))
    (first, _), (default, _) = found[0.0, 1.0], found[gain_by_default, under_by_default]
    loose, measured = found[0.0, under_by_default]
    assert budget - first.compiled_peak_bytes > under_by_default * budget and first.recomputed
    assert default.compile_attempts == 1 and default.saved == first.saved  # stopped at the partitioner
    assert loose.compile_attempts == 2 and any("planned looser" in note for note in loose.notes)
    assert loose.predicted_overhead_seconds < first.predicted_overhead_seconds
    assert measured == loose.compiled_peak_bytes <= budget
    torch._dynamo.reset()  # still with no least gain (the last setting): the looser plan is the one stored
    again = remat.compile(model, budget_gb=budget / GIB, profile="analytic", plan_cache=str(tmp_path))
    again(*inputs).backward()
    torch._dynamo.reset()
    warm = remat.compile(model, budget_gb=budget / GIB, profile="analytic", plan_cache=str(tmp_path))
    warm(*inputs).backward()
    stored, loaded = remat.reports(again)[0], remat.reports(warm)[0]
    assert stored.saved == loose.saved and loaded.saved == loose.saved and loaded.plan_cache in ("hit", "program")


def test_module_state_the_graph_does_not_read_is_counted() -> None:
    """A buffer no graph reads (HF Llama's ``original_inv_freq``) is held through the step, and
    the budget counts the model's state: the compiled peak includes it, to the byte."""
    model, inputs = zoo.build("gpt", **TINY)
    model.register_buffer("unused", torch.zeros(4096))
    torch._dynamo.reset()
    compiled = remat.compile(model, plan_cache=False)
    compiled(*inputs).backward()
    report = remat.reports(compiled)[0]
    assert report.compiled_peak_bytes == measured_with_traced(model, compiled, inputs)
    assert any("16.000 KiB of the module's parameters and buffers" in n for n in report.notes), report.notes


def program(inputs: dict[str, int], events: list[tuple], outputs: list[str], fx_inputs=None, fx_outputs=None):
    return account.Program(inputs=inputs, events=events, outputs=outputs,
                           fx_inputs=list(fx_inputs if fx_inputs is not None else inputs),
                           fx_outputs=list(fx_outputs if fx_outputs is not None else outputs))


def test_a_saved_value_lives_until_the_backward_frees_it() -> None:
    forward = program({"w": 100}, [("alloc", "buf0", 10), ("alloc", "buf1", 1000), ("alloc", "buf2", 1),
                                   ("drop", "buf1")], ["buf2", "buf0"], fx_outputs=["loss", "saved"])
    backward = program({"saved": 10, "tangents_1": 1}, [("alloc", "buf0", 2000), ("drop", "saved"),
                                                        ("alloc", "buf1", 15)], ["buf0"])
    step = account.step_account([forward, backward])
    # backward starts with w 100, saved 10, loss 1, tangent 1; freeing saved makes room for buf1:
    # 112 + 2000 - 10 + 15 = 2117 (2127 if the saved value were held to the end)
    assert step.peak_bytes == 2117 and step.peak_at == "backward line 2"


def test_an_extern_kernels_tuple_is_freed_with_its_name() -> None:
    forward = program({"x": 8}, [("alloc", "buf3[0]", 100), ("alloc", "buf3[1]", 200),
                                 ("alias", "buf4", "buf3[0]"), ("drop", "buf3"), ("alloc", "buf5", 250)],
                      ["buf4"], fx_outputs=["loss"])
    backward = program({"tangents_1": 1}, [], [])
    # after ``del buf3`` only buf4 (element 0) holds memory: 8 + 100 + 250 (558 if element 1 were held)
    assert account.step_account([forward, backward]).peak_bytes == 8 + 100 + 250


def test_extern_kernel_scratch_counts_only_while_it_runs() -> None:
    forward = program({"x": 8}, [("alloc", "buf0", 100), ("scratch", ("convolution",)), ("drop", "buf0"),
                                 ("alloc", "buf1", 1)], ["buf1"], fx_outputs=["loss"])
    backward = program({"tangents_1": 1}, [], [])
    assert account.step_account([forward, backward], {"convolution": 500}).peak_bytes == 8 + 100 + 500
    assert account.step_account([forward, backward]).peak_bytes == 8 + 100


def test_cuda_allocations_round_up_to_512_bytes() -> None:
    assert account.rounded(("alloc", "buf0", 513), 512) == ("alloc", "buf0", 1024)
    assert account.rounded(("alloc", "buf0", 513), 1) == ("alloc", "buf0", 513)


def test_a_budget_below_every_plan_is_refused_when_the_fastest_plan_is_the_smallest_too(programs: list) -> None:
    """On a GPT this small recomputing saves nothing: the fastest plan is the smallest-peak plan. The
    fitting loop asks for each fall-back once and refuses after two programs (it asked for the fastest
    plan again and again, without end, when that plan counted as the smallest only)."""
    model, inputs = zoo.build("gpt", layers=2, d_model=32, heads=8, seq=16, vocab=1024)
    torch._dynamo.reset()
    compiled = remat.compile(model, budget_gb=1 / GIB, profile="analytic", plan_cache=False)
    with pytest.raises(remat.BudgetError) as caught:
        compiled(*inputs)
    assert caught.value.budget_bytes == 1 and len(programs) <= 2
    assert caught.value.min_feasible_bytes >= min(peak for _, _, peak in programs)
