"""plan_diff: base order and planned order side by side, then the rewrites."""

from __future__ import annotations

import re

from flexgraph import Graph, Remove, Replace, Step, Strategy, make_plan
from flexgraph.render import diff as diff_view
from flexgraph.render import plan_diff


def rows(plan) -> list[tuple[str, str, str, str]]:
    """(base #, base cell, planned #, planned cell) of each row, as plain text."""
    return [tuple(cell.plain for cell in row[:4]) for row in diff_view._rows(plan)]


def test_rows_align_by_step_not_by_position(plan):
    table = rows(plan)
    assert table[0] == ("1", "  setup_env", "1", "  setup_env")
    assert ("9", "  train", "8", "  train") in table  # the base is one longer than the plan
    assert len(table) == 11


def test_a_moved_step_has_a_row_at_each_place_naming_the_other(plan, plain):
    table = rows(plan)
    assert ("4", "~ load_checkpoint -> 6", "", "") in table
    assert ("", "", "6", "~ load_checkpoint") in table
    old = table.index(("4", "~ load_checkpoint -> 6", "", ""))
    assert old < table.index(("", "", "6", "~ load_checkpoint"))
    assert "(base position 4)" in plain(plan_diff(plan))


def test_each_planned_step_is_marked_with_what_happened(plan, plain):
    table = {row[3].strip(): row for row in rows(plan) if row[3]}
    assert table["* build_model"][1] == "  build_model"
    assert table["+ freeze_backbone"][1] == ""
    assert table["! shard_model"][1] == "- wrap_model -> shard_model"
    assert table["& build_optim"][1] == "- build_optim_wrapper -> build_optim"
    out = plain(plan_diff(plan))
    for said in ("configured by demo #5", "inserted by demo #1", "replaced by demo #3",
                 "moved by demo #2", "fused by demo #4"):
        assert said in out


def test_taken_out_base_steps_are_marked_and_say_by_what(plan, plain):
    table = rows(plan)
    assert ("7", "- resume", "", "") in table
    assert ("8", "- build_param_schedulers -> build_optim", "", "") in table
    text = plain(plan_diff(plan))
    assert "resume removed by demo #6: remove resume" in text


def test_taken_out_steps_are_struck_through_in_colour(plan, ansi):
    text = ansi(plan_diff(plan))
    for name in ("resume", "wrap_model", "build_optim_wrapper", "build_param_schedulers"):
        assert re.search(rf"\x1b\[[0-9;]*\b9\b[0-9;]*m{name}\x1b\[0m", text), name


def test_lists_every_rewrite_numbered(plan, plain):
    text = plain(plan_diff(plan))
    listing = text[text.index("rewrites applied by demo:") :].splitlines()[1:]
    assert [line.strip() for line in listing] == [
        "demo #1: insert freeze_backbone after init_weights",
        "demo #2: move load_checkpoint after wrap_model",
        "demo #3: replace wrap_model with shard_model (demo.steps:shard_model)",
        "demo #4: fuse build_optim_wrapper, build_param_schedulers into build_optim",
        "demo #5: configure build_model: device='meta'",
        "demo #6: remove resume",
    ]


def test_legend_explains_the_markers(plan, plain):
    text = plain(plan_diff(plan))
    assert "+ inserted   ~ moved   ! replaced   & fused   * configured   - removed" in text


def test_a_replace_that_keeps_the_name_is_not_shown_as_removed():
    graph = Graph.of([Step("a", "m:a", provides="x"), Step("b", "m:b", requires="x")])
    plan = make_plan(graph, Strategy("s", [Replace("a", Step("a", "m:a2", provides="x"))]))
    assert rows(plan)[0] == ("1", "  a", "1", "! a")


def test_without_a_strategy_nothing_is_marked(base_plan, plain):
    text = plain(plan_diff(base_plan))
    assert "plan diff: base graph -> no strategy" in text
    assert "no rewrites applied" in text
    assert rows(base_plan) == [(str(i), f"  {n}", str(i), f"  {n}")
                               for i, n in enumerate(base_plan.order, 1)]


def test_removing_the_last_step_leaves_an_empty_planned_cell(plain):
    graph = Graph.of([Step("a", "m:a", provides="x"), Step("b", "m:b", requires="x")])
    plan = make_plan(graph, Strategy("s", [Remove("b")]))
    assert rows(plan)[1] == ("2", "- b", "", "")
    last = plain(plan_diff(plan)).splitlines()[4]
    assert last.split() == ["2", "-", "b", "b", "removed", "by", "s", "#1:", "remove", "b"]


def test_the_change_column_never_breaks_a_name(plain):
    graph = Graph.of([Step("a", "m:a", provides="x")])
    long = "package.with_a_long_module_name.steps:do_the_thing_with_a_long_name"
    plan = make_plan(graph, Strategy("s", [Replace("a", Step("a", long, provides="x"))]))
    for width in (60, 80, 120):
        words = set(re.findall(r"\w+", plain(plan_diff(plan), width=width)))
        assert {"with_a_long_module_name", "do_the_thing_with_a_long_name"} <= words


def test_is_deterministic(plan, plain):
    assert plain(plan_diff(plan)) == plain(plan_diff(plan))
