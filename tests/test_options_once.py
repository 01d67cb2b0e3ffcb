"""The options have one definition (remat.Options): every entry point takes the same names and defaults."""

from __future__ import annotations

import inspect

import pytest

import remat
from remat.cli import parser
from remat.options import given as option_values


@pytest.mark.parametrize("entry", [remat.compile, remat.plan, remat.sweep], ids=lambda f: f.__name__)
def test_entry_points_take_the_options_with_their_defaults(entry) -> None:  # type: ignore[no-untyped-def]
    params = inspect.signature(entry).parameters
    defaults = remat.Options().kwargs()
    taken = {name: params[name].default for name in remat.Options.names() if name in params}
    assert taken == {name: defaults[name] for name in taken}
    # sweep sets the budgets itself and plans from one capture: no budget_gb or plan_cache
    expected = set(remat.Options.names()) - ({"budget_gb", "plan_cache"} if entry is remat.sweep else set())
    assert set(taken) == expected


def test_the_command_line_has_a_flag_for_each_option() -> None:
    args = parser().parse_args(["plan", "gpt", "--headroom", "0.1", "--plan-cache", "off", "--profile", "analytic"])
    values = option_values(args)
    assert set(values) == set(remat.Options.names())
    assert remat.Options(**values) == remat.Options(headroom=0.1, plan_cache=False, profile="analytic")
