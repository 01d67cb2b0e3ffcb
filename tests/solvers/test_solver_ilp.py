"""The ILP: exact answers, brute-force equality, never worse than baselines."""

from __future__ import annotations

from dataclasses import replace

import pytest

from remat.solvers import (
    ILPConfig,
    Infeasible,
    NoPlanFound,
    Problem,
    Solution,
    Status,
    check_plan,
    greedy,
    min_peak,
    recompute_all,
    solve_ilp,
    store_all,
)
from remat.solvers import ilp
from remat.solvers.backends import Outcome, run_backend
from remat.solvers.model import outside_with_copies, start_segments
from remat.solvers.simulate import evaluate
from remat.solvers.testing import Node, brute_force, build_problem, random_problem

BACKENDS = ["highs", "cbc"]
EXACT = ILPConfig(mip_gap=1e-9)  # brute-force comparisons want the true optimum


def assert_valid(problem: Problem, plan: Solution, budget: int | None) -> None:
    check_plan(problem, plan.saved, plan.recomputed)
    assert plan.peak_bytes == max(plan.timeline)
    assert budget is None or plan.peak_bytes <= budget


@pytest.mark.parametrize("backend", BACKENDS)
def test_recomputing_the_cheap_value_is_optimal(branch: Problem, backend: str) -> None:
    config = ILPConfig(backend=backend)
    plan = solve_ilp(branch, 350, config=config)
    assert (plan.saved, plan.recomputed, plan.peak_bytes) == ({"a"}, {"b"}, 320)
    assert plan.added_seconds == pytest.approx(0.1)
    assert plan.status is Status.OPTIMAL and plan.solver == f"ilp-{backend}"
    both = solve_ilp(branch, 250, config=config)
    assert (both.recomputed, both.peak_bytes) == ({"a", "b"}, 230)
    assert both.added_seconds == pytest.approx(5.1)


def test_generous_budget_keeps_everything(branch: Problem) -> None:
    plan = solve_ilp(branch, None)
    assert (plan.saved, plan.added_seconds) == ({"a", "b"}, 0.0)


def test_ties_go_to_less_memory(make_branch) -> None:  # type: ignore[no-untyped-def]
    """Recomputing b is free, so without a budget both plans cost 0 s; the
    tie-break picks the lower peak."""
    plan = solve_ilp(make_branch(b_seconds=0.0), None)
    assert (plan.saved, plan.recomputed) == ({"a"}, {"b"})
    assert (plan.peak_bytes, plan.added_seconds) == (320, 0.0)


def test_a_banned_random_op_is_kept(make_branch) -> None:  # type: ignore[no-untyped-def]
    problem = make_branch(ban_b=True)
    plan = solve_ilp(problem, 350)
    assert (plan.saved, plan.recomputed, plan.peak_bytes) == ({"b"}, {"a"}, 320)
    with pytest.raises(Infeasible):
        solve_ilp(problem, 300)


def test_an_unsavable_view_keeps_its_base(view: Problem) -> None:
    plan = solve_ilp(view, 400)
    assert (plan.saved, plan.recomputed, plan.added_seconds) == ({"a"}, {"v"}, 0.0)
    tight = solve_ilp(view, 250)
    assert (tight.saved, tight.recomputed, tight.added_seconds) == (set(), {"a", "v"}, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_budget_below_reachable_is_infeasible(chain: Problem, backend: str) -> None:
    assert solve_ilp(chain, 220, config=ILPConfig(backend=backend)).peak_bytes == 220
    with pytest.raises(Infeasible, match="min_peak"):
        solve_ilp(chain, 219, config=ILPConfig(backend=backend))


def test_budget_below_fixed_memory_names_the_step(chain: Problem) -> None:
    with pytest.raises(Infeasible, match="210 bytes that every plan holds at step 1"):
        solve_ilp(chain, 19)


def test_min_peak_of_tiny_problems(branch: Problem, chain: Problem) -> None:
    assert min_peak(branch).peak_bytes == 230
    assert min_peak(chain).peak_bytes == 220


def small_problems() -> list[Problem]:
    """Random problems with at most 12 savable candidates (brute-forceable)."""
    found = []
    for seed in range(200):
        problem = random_problem(seed, 12, 10)
        if 4 <= sum(v.savable for v in problem.candidates()) <= 12:
            found.append(problem)
        if len(found) == 8:
            return found
    raise AssertionError("not enough small problems")


SMALL = small_problems()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index", range(len(SMALL)))
def test_ilp_matches_brute_force(index: int, backend: str) -> None:
    problem = SMALL[index]
    plans = brute_force(problem)
    peaks = sorted({p.peak_bytes for p in plans})
    config = ILPConfig(backend=backend, mip_gap=1e-9)
    for budget in (peaks[0], peaks[len(peaks) // 2], peaks[-1]):
        best = min(p.added_seconds for p in plans if p.peak_bytes <= budget)
        plan = solve_ilp(problem, budget, config=config)
        assert_valid(problem, plan, budget)
        assert plan.added_seconds == pytest.approx(best, rel=1e-6, abs=1e-9)
        assert plan.status is Status.OPTIMAL
    with pytest.raises(Infeasible):
        solve_ilp(problem, peaks[0] - 1, config=config)


@pytest.mark.parametrize("index", range(len(SMALL)))
def test_min_peak_matches_brute_force(index: int) -> None:
    problem = SMALL[index]
    assert min_peak(problem, config=EXACT).peak_bytes == min(p.peak_bytes for p in brute_force(problem))


@pytest.mark.parametrize("seed", range(6))
def test_ilp_never_worse_than_baselines(seed: int) -> None:
    problem = random_problem(100 + seed, 60, 60)
    floor = min_peak(problem).peak_bytes
    ceiling = store_all(problem).peak_bytes
    for budget in (floor, (floor + ceiling) // 2, ceiling):
        plan = solve_ilp(problem, budget)
        assert_valid(problem, plan, budget)
        for baseline in (store_all(problem), recompute_all(problem), greedy(problem, budget)):
            if baseline.peak_bytes <= budget:
                assert plan.added_seconds <= baseline.added_seconds * (1 + 1e-4) + 1e-9


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("time_limit_s", [0.05, 0.5])
def test_time_limit_still_returns_a_plan_within_budget(backend: str, time_limit_s: float) -> None:
    problem = random_problem(11, 400, 400)
    assert len(problem.candidates()) >= 300
    budget = greedy(problem, 0).peak_bytes + 1
    plan = solve_ilp(problem, budget, config=ILPConfig(backend=backend, time_limit_s=time_limit_s))
    assert_valid(problem, plan, budget)
    assert plan.status in (Status.OPTIMAL, Status.FEASIBLE, Status.FALLBACK)
    assert plan.bound is None or plan.bound <= plan.added_seconds + 1e-9


@pytest.mark.parametrize(
    ("seed", "n_forward", "n_backward", "budget"), [(302, 13, 11, 756), (408, 12, 7, 501)]
)
def test_highs_mip_start_echo_is_caught(
    seed: int, n_forward: int, n_backward: int, budget: int
) -> None:
    """HiGHS 1.16 may return its MIP start while reporting a better
    objective; run_backend notices and solves again without the start."""
    problem = random_problem(seed, n_forward, n_backward)
    best = min(p.added_seconds for p in brute_force(problem) if p.peak_bytes <= budget)
    assert solve_ilp(problem, budget, config=EXACT).added_seconds == pytest.approx(best, rel=1e-6)


def test_highs_runs_without_its_sub_mip_heuristics() -> None:
    """RINS and RENS took most of a small graph's solve and found no better plan (backends.HIGHS_OPTIONS)."""
    pulp = pytest.importorskip("pulp")
    prob = pulp.LpProblem("tiny", pulp.LpMinimize)
    x = pulp.LpVariable("x", cat="Binary")
    prob += x
    prob += x >= 0
    assert run_backend(prob, ILPConfig()).status is Status.OPTIMAL
    for option in ("mip_heuristic_run_rins", "mip_heuristic_run_rens"):
        value = prob.solverModel.getOptionValue(option)
        assert (value[1] if isinstance(value, tuple) else value) is False


def test_solver_failure_returns_the_seed_loudly(
    branch: Problem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ilp, "run_backend", lambda prob, config: Outcome(None, reason="boom"))
    plan = solve_ilp(branch, 350)
    assert plan.status is Status.FALLBACK and plan.solver == "ilp-highs"
    assert any("boom" in note and "greedy" in note for note in plan.notes)
    assert_valid(branch, plan, 350)


def test_a_wrong_infeasible_claim_returns_the_seed(
    branch: Problem, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = Outcome(None, infeasible=True, reason="highs reports the budget infeasible")
    monkeypatch.setattr(ilp, "run_backend", lambda prob, config: claim)
    assert solve_ilp(branch, 500).status is Status.FALLBACK


def test_no_seed_and_no_solution_raises(branch: Problem, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ilp, "run_backend", lambda prob, config: Outcome(None, reason="time limit"))
    monkeypatch.setattr(ilp, "seed_plan", lambda *args: None)
    with pytest.raises(NoPlanFound, match="time limit"):
        solve_ilp(branch, 350)


def scaled(problem: Problem, nbytes: int, seconds: float) -> Problem:
    """The same problem with bytes and seconds in other units."""
    values = tuple(
        replace(
            v,
            bytes=v.bytes * nbytes,
            recompute_seconds=v.recompute_seconds * seconds,
            save_seconds=v.save_seconds * seconds,
        )
        for v in problem.values
    )
    workspace = tuple(w * nbytes for w in problem.workspace)
    return replace(problem, values=values, workspace=workspace)


@pytest.mark.parametrize(("nbytes", "seconds"), [(2**20, 1e-6), (3 * 2**30, 1e3)])
def test_units_do_not_change_the_plan(nbytes: int, seconds: float) -> None:
    """Realistic magnitudes (MiB..GiB, microseconds..kiloseconds) exercise
    the model's unit scaling; the optimum must scale with them."""
    problem = random_problem(5, 60, 60)
    big = scaled(problem, nbytes, seconds)
    floor = min_peak(problem, config=EXACT)
    assert min_peak(big, config=EXACT).peak_bytes == floor.peak_bytes * nbytes
    for budget in (floor.peak_bytes, floor.peak_bytes + 50, store_all(problem).peak_bytes):
        plan = solve_ilp(problem, budget, config=EXACT)
        big_plan = solve_ilp(big, budget * nbytes, config=EXACT)
        assert big_plan.added_seconds == pytest.approx(plan.added_seconds * seconds, rel=1e-6)
        assert big_plan.peak_bytes <= budget * nbytes


def chain_problems() -> list[Problem]:
    """Brute-forceable problems where some value has three or more possible
    starts: recompute chains the program must follow exactly."""
    found = []
    for seed in range(300):
        problem = random_problem(seed, 14, 12)
        savable = sum(v.savable for v in problem.candidates())
        deepest = max(len(s.bounds) for s in start_segments(problem).values())
        if 4 <= savable <= 12 and deepest >= 3:
            found.append(problem)
        if len(found) == 8:
            return found
    raise AssertionError("not enough chain problems")


CHAINS = chain_problems()


@pytest.mark.parametrize("index", range(len(CHAINS)))
def test_min_peak_is_exact_on_recompute_chains(index: int) -> None:
    problem = CHAINS[index]
    assert min_peak(problem, config=EXACT).peak_bytes == min(p.peak_bytes for p in brute_force(problem))


def long_chain() -> Problem:
    """x -> a -> b -> c -> d (10 B) -> out; the backward reads d, allocates
    t (1000 B), then reads c, b and a in turn.

    The smallest peak keeps d (until gd) and recomputes a, b, c from x where c
    is read, after t: 1020 B at t (x, out, t). ``b`` may start where d is read
    (if d were recomputed), where c is read, or at its own read: a program that
    cannot tell the middle start from the earliest holds b (and a) through t.
    """
    forward = [Node("a", 100, ("x",), recompute_seconds=1.0), Node("b", 100, ("a",), recompute_seconds=1.0),
               Node("c", 100, ("b",), recompute_seconds=1.0), Node("d", 10, ("c",), recompute_seconds=1.0),
               Node("out", 10, ("d",), output=True)]
    backward = [Node("gd", 10, ("d",)), Node("t", 1000), Node("gc", 10, ("c",)), Node("gb", 10, ("b",)),
                Node("ga", 10, ("a",), grad=True)]
    return build_problem([("x", 10)], forward, backward)


def test_a_long_chain_starts_where_it_is_first_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = long_chain()
    assert min(p.peak_bytes for p in brute_force(problem)) == 1020
    assert min_peak(problem, config=EXACT).peak_bytes == 1020
    # one segment before the read (the earlier formulation's two start options,
    # the earliest and the read) over-counts b through t
    monkeypatch.setattr(ilp, "start_segments", lambda problem: start_segments(problem, 1))
    assert min_peak(problem, config=EXACT).peak_bytes > 1020


def assert_ilp_matches_brute_force(problem: Problem) -> list[int]:
    """At the smallest peak and half way up the plans' peaks the ILP finds the fastest plan brute
    force does, and the smallest peak too; the plans' distinct peaks, lowest first."""
    plans = brute_force(problem)
    peaks = sorted({p.peak_bytes for p in plans})
    for budget in (peaks[0], peaks[len(peaks) // 2]):
        best = min(p.added_seconds for p in plans if p.peak_bytes <= budget)
        plan = solve_ilp(problem, budget, config=EXACT)
        assert_valid(problem, plan, budget)
        assert plan.added_seconds == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert min_peak(problem, config=EXACT).peak_bytes == peaks[0]
    return peaks


@pytest.mark.parametrize("index", range(0, len(SMALL), 2))
def test_other_copies_and_outside_memory_enter_every_row(index: int) -> None:
    """A per-rank problem (two more copies of the graph keep their kept values; shards held
    outside it): the simulator adds exactly that to every step, and the ILP still matches
    brute force over it."""
    alone = SMALL[index]
    problem = replace(alone, outside=(("shards", 600), ("buffers", 400)), kept_copies=2)
    for plan in brute_force(alone)[:8]:
        extra = 1000 + 2 * sum(alone.by_name()[n].bytes for n in plan.saved)
        scoped = evaluate(problem, plan.saved)
        assert [a - b for a, b in zip(scoped.timeline, plan.timeline)] == [extra] * len(plan.timeline)
        assert outside_with_copies(problem, plan.saved) == extra
    peaks = assert_ilp_matches_brute_force(problem)
    with pytest.raises(Infeasible):
        solve_ilp(problem, peaks[0] - 1, config=EXACT)


@pytest.mark.parametrize("index", range(0, len(SMALL), 2))
def test_eager_handoff_bytes_enter_the_forwards_last_row_only(index: int) -> None:
    """The rank's eager head and loss run between the forward and the backward: the simulator adds
    them at the forward's last step alone, and the ILP still matches brute force over it."""
    alone = SMALL[index]
    handoff = 1 + max(p.peak_bytes for p in brute_force(alone)[:8]) // 3
    problem = replace(alone, handoff=(("head and loss", handoff),))
    last = alone.num_forward_steps - 1
    for plan in brute_force(alone)[:8]:
        shifted = evaluate(problem, plan.saved).timeline
        assert [a - b for a, b in zip(shifted, plan.timeline)] == [handoff if t == last else 0
                                                                 for t in range(len(shifted))]
    assert_ilp_matches_brute_force(problem)
