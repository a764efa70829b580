"""plan_diff: base order and planned order side by side, then the rewrites."""

from __future__ import annotations

import re

from flexgraph import Graph, Remove, Replace, Step, Strategy, make_plan
from flexgraph.render import plan_diff


def rows(text: str) -> dict[int, str]:
    """Table rows by their 1-based position (continuation lines dropped)."""
    found = {}
    for line in text.splitlines():
        if match := re.match(r"^\s*(\d+)\s+(.*)$", line):
            found[int(match[1])] = match[2]
    return found


def test_rows_pair_base_and_planned_positions(plan, plain):
    table = rows(plain(plan_diff(plan)))
    assert len(table) == max(len(plan.base_order), len(plan.order)) == 9
    assert table[1].split() == ["setup_env", "setup_env"]
    assert table[9].split() == ["train"]  # the base is one longer than the plan


def test_each_planned_step_is_marked_with_what_happened(plan, plain):
    table = rows(plain(plan_diff(plan)))
    assert "* build_model" in table[2] and "configured by demo #5" in table[2]
    assert "+ freeze_backbone" in table[4] and "inserted by demo #1" in table[4]
    assert "! shard_model" in table[5] and "replaced by demo #3" in table[5]
    assert "~ load_checkpoint" in table[6] and "moved by demo #2" in table[6]
    assert "& build_optim" in table[7] and "fused by demo #4" in table[7]


def test_taken_out_base_steps_are_marked_and_say_by_what(plan, plain):
    table = rows(plain(plan_diff(plan)))
    assert table[5].startswith("- wrap_model -> shard_model ")
    assert table[6].startswith("- build_optim_wrapper -> build_optim ")
    assert table[7].startswith("- resume ")
    assert table[8].startswith("- build_param_schedulers -> build_optim ")
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


def test_a_replace_that_keeps_the_name_is_not_shown_as_removed(plain):
    graph = Graph.of([Step("a", "m:a", provides="x"), Step("b", "m:b", requires="x")])
    plan = make_plan(graph, Strategy("s", [Replace("a", Step("a", "m:a2", provides="x"))]))
    table = rows(plain(plan_diff(plan)))
    assert table[1].split()[:3] == ["a", "!", "a"]


def test_without_a_strategy_nothing_is_marked(base_plan, plain):
    text = plain(plan_diff(base_plan))
    assert "plan diff: base graph -> no strategy" in text
    assert "no rewrites applied" in text
    for position, row in rows(text).items():
        name = base_plan.order[position - 1]
        assert row.split() == [name, name]


def test_removing_the_last_step_leaves_an_empty_planned_cell(plain):
    graph = Graph.of([Step("a", "m:a", provides="x"), Step("b", "m:b", requires="x")])
    plan = make_plan(graph, Strategy("s", [Remove("b")]))
    assert rows(plain(plan_diff(plan)))[2].split() == ["-", "b", "b", "removed", "by", "s",
                                                       "#1:", "remove", "b"]


def test_is_deterministic(plan, plain):
    assert plain(plan_diff(plan)) == plain(plan_diff(plan))
