"""Each built-in strategy's names come from one table (``strategies/names.py``).

The factories read their name and memory model from it; ``pyproject.toml``'s
entry points, through which the registry finds them, must be the table's (the
built wheel's are checked in ``tests/test_packaging.py``).
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pytest
from flexgraph.strategies.names import BUILT_IN, entry_points

from flexgraph import get_strategy
from flexgraph.core.strategy import known_strategies, same_strategy

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_exactly_the_tables_entry_points():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["flexgraph.strategies"] == entry_points()


@pytest.mark.parametrize("row", BUILT_IN, ids=lambda row: row.name)
def test_both_names_build_the_strategy_the_row_describes(row):
    for key in (row.name, row.alias):
        strategy = get_strategy(key)
        assert strategy.name == row.name, f"{key} built {strategy.name!r}"
        assert strategy.memory_model == row.memory_model
        assert known_strategies()[key].value == row.factory, "reinstall: make install"
    assert same_strategy(row.name, row.alias)
    module, _, function = row.factory.partition(":")
    assert getattr(import_module(module), function)().name == row.name


@pytest.mark.parametrize("row", BUILT_IN, ids=lambda row: row.name)
def test_the_memory_model_the_row_names_estimates(row):
    memory = import_module(row.memory_model)
    assert callable(memory.candidate_options) and callable(memory.estimate_memory)


def test_names_and_aliases_are_unique():
    keys = [key for row in BUILT_IN for key in (row.name, row.alias)]
    assert len(keys) == len(set(keys)) == len(entry_points())
