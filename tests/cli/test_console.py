"""Where the text views go: a terminal's width on a terminal, 120 plain columns in a pipe,
and never a cropped line."""

from __future__ import annotations

import io

from flexgraph import Graph, Step, make_plan
from flexgraph.cli.console import PLAIN_WIDTH, print_renderable, stdout_console
from flexgraph.render import plan_table


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_its_own_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "93")
    assert stdout_console(_Terminal()).width == 93


def test_a_pipe_gets_120_plain_columns_whatever_the_environment_says(monkeypatch):
    monkeypatch.setenv("COLUMNS", "93")
    monkeypatch.setenv("FORCE_COLOR", "1")
    console = stdout_console(io.StringIO())
    assert console.width == PLAIN_WIDTH and console.color_system is None


def test_a_table_wider_than_the_pipe_is_printed_whole_rather_than_break_a_name():
    long = "a_step_whose_name_alone_is_wider_than_any_pipe_" + "x" * 90
    plan = make_plan(Graph.of([Step(long, "m:f", provides="y")]))
    out = io.StringIO()
    print_renderable(plan_table(plan), out)
    assert long in out.getvalue()
