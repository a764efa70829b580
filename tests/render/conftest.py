"""Fixtures of the render tests: the demo plan (see demo_plan.py) and renderers."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from flexgraph import Graph, make_plan
from tests.render.demo_plan import base_graph, demo_strategy


@pytest.fixture
def base() -> Graph:
    return base_graph()


@pytest.fixture
def plan():
    return make_plan(base_graph(), demo_strategy())


@pytest.fixture
def base_plan():
    return make_plan(base_graph())


def render_text(renderable, width: int = 120) -> str:
    """What a pipe would get: rich output without colour, at ``width`` columns."""
    console = Console(
        file=io.StringIO(), width=width, color_system=None, force_terminal=False, highlight=False
    )
    console.print(renderable)
    return console.file.getvalue()


def render_ansi(renderable, width: int = 120) -> str:
    """What a colour terminal would get (ANSI escapes included)."""
    console = Console(
        file=io.StringIO(), width=width, color_system="standard", force_terminal=True
    )
    console.print(renderable)
    return console.file.getvalue()


@pytest.fixture
def plain():
    return render_text


@pytest.fixture
def ansi():
    return render_ansi
