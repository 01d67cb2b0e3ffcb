"""The step object: what its open graphs hold beside a graph compiled now, and the windows it remembers."""

import torch

from remat.passes.scope import rank_scope
from remat.passes.scope.eager_window import EagerParts
from remat.passes.scope.step import STEP, OpenGraph, Step

keys = rank_scope.storages_of
EMPTY = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())  # a graph that traced nothing


def test_open_graphs_count_their_activations_and_state_the_new_graph_does_not_hold() -> None:
    weight, other_weight = torch.nn.Parameter(torch.empty(10)), torch.nn.Parameter(torch.empty(20))
    handed = torch.empty(5)  # the open graph's output, the new graph's input: the new graph counts it
    step = Step()
    step.open("watch", OpenGraph(1000 + 20, keys([weight, other_weight]), keys([handed]), {}))
    taken = set(keys([weight, handed]))
    assert step.held_beside(taken, keys([weight])) == 1000 + 80  # less the 20 handed, plus 80 of state


def test_open_graphs_count_the_batch_they_took_once() -> None:
    # the first graph took token ids (held by the caller through the step) and handed the second graph its
    # output; the third, compiled while both are open, counts the ids once, and not the handed value (the
    # second graph took it: it is among the first's outputs), nor its own input, nor a parameter
    ids, handed, own_input = torch.empty(64, dtype=torch.int64), torch.empty(5), torch.empty(7)
    weight = torch.nn.Parameter(torch.empty(10))
    step = Step()
    step.open("first", OpenGraph(100, {}, keys([handed]), keys([ids])))
    step.open("second", OpenGraph(200, keys([weight]), keys([own_input]), keys([handed, ids, weight])))
    assert step.held_beside(set(keys([weight, own_input])), keys([weight])) == 100 + (200 - 28) + 512
    step.close("second")
    assert step.open_watches() == ["first"]


def test_a_scope_built_now_counts_the_process_steps_open_graphs() -> None:
    weight, handed = torch.nn.Parameter(torch.empty(10)), torch.empty(5)
    watch = object()
    STEP.open(watch, OpenGraph(1000 + 20, keys([weight]), keys([handed]), {}))
    try:
        assert rank_scope.open_graphs_bytes(EMPTY, [weight, handed]) == 1000
    finally:
        STEP.close(watch)
    assert rank_scope.open_graphs_bytes(EMPTY, [weight, handed]) == 0


def test_the_step_remembers_the_largest_window_measured_after_a_graph_and_the_least_it_freed() -> None:
    step = Step()
    assert step.eager_after("g") is None
    step.remember("g", EagerParts(peak=500, after=40, copies=None, other_state=7, freed=30))
    step.remember("g", EagerParts(peak=300, after=60, copies=1, other_state=0, freed=10))
    assert step.eager_after("g") == EagerParts(500, 60, 1, 7, 10)
    step.forget_measured()
    assert step.eager_after("g") is None
