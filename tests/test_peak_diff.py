"""bench/peak_diff.py: the live sets at the peak of eager checkpointing, torch.compile of it and
remat, on a tiny explicit-softmax GPT (CPU).

Each live set must add up to its program's measured peak (``remat.measure.budget_peak``) to the
byte: the CPU profiler's memory events carry the bytes each allocation asked for, so there is no
allocator rounding on the CPU (on CUDA the account rounds each allocation up to 512 B, as the caching
allocator does, and the same equality is what to check there).
"""

from __future__ import annotations

import re

import pytest

from bench.peak_diff import live_sets
from bench.peak_diff_compiled import compiled_live_set, pairs
from bench.peak_diff_eager import Context, enclosing, live_at_peak
from bench.peak_diff_live_set import PROGRAMS, LiveSet, group_of, short_op, unwrapped
from bench.peak_diff_replay import Lowered
from bench.peak_diff_report import diff_rows, markdown
from remat import zoo
from remat.passes.program import inductor_account as account

TINY = {"layers": 2, "d_model": 32, "heads": 4, "seq": 16, "vocab": 64, "batch": 2}
BLOCK_INPUT_BYTES = TINY["batch"] * TINY["seq"] * TINY["d_model"] * 4  # float32 (B, T, C)


@pytest.fixture(scope="module")
def sets() -> dict[str, LiveSet]:
    model, inputs = zoo.build("gpt-softmax", **TINY)
    return live_sets(model, inputs)


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_live_set_adds_up_to_its_measured_peak(sets, program: str) -> None:
    live = sets[program]
    assert live.live_bytes == live.measured_bytes, (live.live_bytes, live.measured_bytes, live.notes)
    if program != "a":  # the compiled programs' live sets are the account's walk, checked by the profiler too
        assert live.accounted_bytes == live.live_bytes
        assert any("has the account's sizes, one for one" in n for n in live.notes), live.notes


def test_the_eager_live_set_holds_the_inputs_checkpoint_keeps(sets) -> None:
    """At a peak inside block j's backward, checkpoint still keeps the inputs of blocks 0..j (each
    freed when its block's backward is done), born in the forward; later blocks' are gone."""
    live = sets["a"]
    block = int(re.search(r"blocks\.(\d+)", live.peak_at).group(1))
    assert live.peak_at.startswith("backward")
    kept = {}
    for b in live.buffers:
        found = re.search(r"the input checkpoint keeps for blocks\.(\d+)", b.born)
        if found:
            kept[int(found.group(1))] = b
    assert sorted(kept) == list(range(block + 1)), (sorted(kept), live.peak_at)
    for b in kept.values():
        assert b.role == "kept" and b.bytes == BLOCK_INPUT_BYTES and b.born.startswith("forward")
        assert b.freed.startswith("backward")
    assert kept[0].op == "add" and kept[0].module == ""  # token + position embeddings, in the model's own code


def test_buffers_name_the_op_or_fx_node_that_made_them(sets) -> None:
    eager = [b for b in sets["a"].buffers if b.role not in ("held", "before")]
    named = sum(b.bytes for b in eager if b.op)
    assert named >= 0.95 * sum(b.bytes for b in eager)
    # checkpoint's recompute runs a block's modules again inside the backward: named by them
    recomputed = [b for b in eager if b.role == "recomputed"]
    assert recomputed and all(b.module.startswith("blocks.") and " in blocks." in b.born for b in recomputed)
    # every parameter gradient lives to the end of the step and is named by its module
    grads = [b for b in eager if b.role == "gradient"]
    assert grads and all(b.freed == "alive at the end of the step" and b.module for b in grads)
    for program in ("b", "c"):
        for b in sets[program].buffers:
            if b.role in ("held", "scratch") or b.op == "tangent":
                continue
            assert re.fullmatch(r"(forward|backward) event \d+: buf\d+(\[\d+\])? = \w+ \(\w+\)( in [\w.]+)?", b.born), \
                b.born
            assert b.op and b.op in b.born


def test_the_replay_is_the_accounts_walk(sets) -> None:
    """The live set of a compiled program is read from a replay of ``inductor_account``'s walk:
    its peak must be the account's, program by program."""
    for program in ("b", "c"):
        live = sets[program]
        assert not any("differs from the account" in n for n in live.notes), live.notes
        assert live.accounted_bytes == live.live_bytes


def test_the_summary_shows_what_compiled_programs_hold_beyond_eager(sets) -> None:
    rows = diff_rows(sets)
    assert all(max(r["bytes"]["b"], r["bytes"]["c"]) > r["bytes"]["a"] for r in rows)
    text = markdown(sets, "title", "command")
    for program in PROGRAMS:
        assert f"{sets[program].measured_bytes / 2 ** 20:.2f}" in text


def test_live_at_peak_pairs_allocations_and_frees_by_address() -> None:
    """A synthetic event stream: memory freed that was allocated before the step counts against
    the step, an address reused after a free is a new allocation, and the first highest total is
    the peak."""
    ctx = Context(False, "", "op", "", None)
    events = [(100, 1, 40), (200, 2, 40), (100, 1, -40), (300, 3, 60), (999, 9, -8), (100, 4, 40), (300, 3, -60)]
    total, memory = 0, []
    for addr, _, nbytes in events:
        total += nbytes
        memory.append({"args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": 1000 + total}})
    peak, alive, before = live_at_peak(memory, [ctx] * len(memory))
    assert peak == 5 and before == 8
    assert sorted((a.addr, a.bytes) for a in alive) == [(100, 40), (200, 40), (300, 60)]
    assert sum(a.bytes for a in alive) - before == max(m["args"]["Total Allocated"] for m in memory) - 1000
    assert [a.freed is not None for a in sorted(alive, key=lambda a: a.addr)] == [False, False, True]


def test_enclosing_finds_the_ranges_around_each_time() -> None:
    outer = {"name": "outer", "ts": 0.0, "dur": 10.0}
    inner = {"name": "inner", "ts": 2.0, "dur": 3.0}
    later = {"name": "later", "ts": 6.0, "dur": 1.0}
    stacks = enclosing([later, inner, outer], [1.0, 3.0, 5.0, 5.5, 6.5, 11.0])
    assert [[e["name"] for e in s] for s in stacks] == [
        ["outer"], ["outer", "inner"], ["outer", "inner"], ["outer"], ["outer", "later"], []]


def test_names_compare_across_programs() -> None:
    assert short_op("aten::addmm") == short_op("aten.addmm.default") == "addmm"
    assert unwrapped("blocks.3.block.attn.qkv") == "blocks.3.attn.qkv"
    assert group_of("blocks.3.attn.qkv") == "blocks.*.attn"
    assert group_of("lm_head") == "lm_head" and group_of("") == "(model's own code)"


def test_a_capture_pairs_forward_and_backward() -> None:
    program = account.Program(inputs={})
    fwd, bwd = Lowered(program, {}, False), Lowered(program, {}, True)
    assert pairs([fwd, fwd, bwd, bwd, fwd]) == [(fwd, bwd)]


def test_torch_compiles_checkpointed_sdpa_program_is_read_whole() -> None:
    """On an SDPA model, ``torch.compile`` of a checkpointed block wraps the attention in
    ``run_and_save_rng_state``: its attention output is an element of a nested tuple no wrapper
    line allocates, and its RNG states reach the backward under other names. The live set counts
    each once, and adds up to the measured peak; ``inductor_account``'s own figure does not."""
    model, inputs = zoo.build("llama", **TINY)
    live = compiled_live_set(model, inputs)
    assert live.live_bytes == live.measured_bytes, live.notes
    assert any("no wrapper line allocates" in n for n in live.notes), live.notes
    assert any("rng_state_output_0" in n for n in live.notes), live.notes
    assert live.accounted_bytes != live.live_bytes
