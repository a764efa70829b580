"""The views say why: the model's state after each step, each rewrite's reason, the
conditional rewrites skipped and why, the user's steps marked, one numbering."""

from __future__ import annotations

import json

import pytest

from flexgraph import (
    Configure,
    Graph,
    IfAbsent,
    IfPresent,
    Move,
    Replace,
    Step,
    Strategy,
    make_plan,
)
from flexgraph.render import diff as diff_view
from flexgraph.render import explain_step, plan_diff, plan_json, plan_table, plan_to_dict
from flexgraph.render.plan_change import plan_change_view, plan_changes


def steps() -> list[Step]:
    return [
        Step("build_model", "m:build", requires="cfg", provides="model",
             gives=("whole", "unwrapped")),
        Step("init_weights", "m:init", updates="model", gives="initialised"),
        Step("load_checkpoint", "m:load", updates="model", gives="loaded"),
        Step("wrap_model", "m:wrap", updates="model", gives="on_device"),
        Step("train", "m:train", requires="model"),
    ]


ENGINE = Strategy("engine", [
    Replace("wrap_model", Step("engine", "m:engine", updates="model", gives="in_engine",
                               ends="unwrapped"), why="the engine wraps the model"),
    Move("load_checkpoint", after="engine", why="weights go in through the engine"),
    IfPresent("compile", Move("compile", before="engine"), why="compile before wrapping"),
    IfAbsent("init_weights", Configure("build_model", {"device": "meta"}),
             why="nothing to initialise"),
])


def needs_plan(strategy: Strategy = ENGINE):
    """``steps()`` with two steps of the user's, one placed by its needs, under ``strategy``."""
    count = Step("count", "mine:count", requires="model", after="load_checkpoint",
                 needs="loaded", user="custom_steps")
    freeze = Step("freeze", "mine:freeze", updates="model", after="load_checkpoint",
                  before="wrap_model", needs="loaded", user="custom_steps")
    graph = Graph.of(steps(), inputs=["cfg"]).extend([freeze, count])
    return make_plan(graph, strategy)


@pytest.fixture
def plan():
    return needs_plan()


def test_the_table_marks_the_users_steps_and_says_what_the_model_is_after_each(plan, plain):
    table = plan_table(plan)
    origins = dict(zip(plan.order, (str(c) for c in table.columns[-1].cells), strict=True))
    assert origins["count"] == "user"
    assert origins["freeze"] == "user\nplaced by need"
    assert origins["init_weights"] == "base"
    out = unpadded(plain(table, width=200))
    assert out.endswith(
        "the model after each step that changes it:\n"
        "  build_model      unwrapped, whole\n"
        "  init_weights     initialised, unwrapped, whole\n"
        "  engine           in_engine, initialised, whole\n"
        "  load_checkpoint  in_engine, initialised, loaded, whole\n"
        "  freeze           in_engine, initialised, loaded, whole")


def unpadded(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines())


def test_the_caption_counts_the_skipped_rewrites_and_says_why(plan, plain):
    out = unpadded(plain(plan_table(plan), width=200))
    assert "4 rewrites: 2 applied, 2 skipped" in out
    assert ("  engine #1: replace wrap_model with engine (m:engine)\n"
            "    why: the engine wraps the model") in out
    assert "  engine #3: move compile before engine, when compile is planned\n    skipped: " \
           "compile is not planned" in out
    assert "  engine #4: configure build_model: device='meta', when init_weights is not " \
           "planned\n    skipped: init_weights is planned" in out
    assert "freeze placed by need: after load_checkpoint, where the model has loaded " \
           "(its anchors contradict: engine runs before load_checkpoint under 'engine' (engine " \
           "-> load_checkpoint) (engine #2: move load_checkpoint after engine: weights go in " \
           "through the engine))" in " ".join(out.split())


def test_the_diff_marks_the_users_steps_and_gives_each_change_its_reason(plan, plain):
    text = unpadded(plain(plan_diff(plan), width=200))
    table = [" ".join(cell.plain for cell in row) for row in diff_view._rows(plan)]
    placed = next(row for row in table if row.startswith("  5 > freeze"))
    assert "placed by need: after load_checkpoint" in placed
    assert "4 > freeze -> 5" in table[3]
    assert any("7 u count" in row for row in table)
    assert "why: the engine wraps the model" in text
    assert "> placed   u user" in text
    listing = text[text.index("rewrites of engine (2 applied, 2 skipped):"):]
    assert "engine #3: move compile before engine, when compile is planned\n" \
           "    skipped: compile is not planned" in listing


def test_explain_gives_the_reason_the_state_and_the_needs(plan):
    text = explain_step(plan, "load_checkpoint")
    assert "  moved by engine #2: move load_checkpoint after engine\n" \
           "    why: weights go in through the engine" in text
    assert "  the model after it: in_engine, initialised, loaded, whole" in text
    freeze = explain_step(plan, "freeze")
    assert freeze.splitlines()[1:4] == [
        "  the user's step (custom_steps)",
        "  placed by need: after load_checkpoint, where the model has loaded (its anchors "
        "contradict: engine runs before load_checkpoint under 'engine' (engine -> "
        "load_checkpoint) (engine #2: move load_checkpoint after engine: weights go in through "
        "the engine))",
        "  needs of the model: loaded (declared)",
    ]
    assert "why: the engine wraps the model" in explain_step(plan, "wrap_model")


def test_explain_names_the_skipped_rewrites_about_a_step(plan):
    assert ("  skipped engine #4: configure build_model: device='meta', when init_weights is "
            "not planned (init_weights is planned)") in explain_step(plan, "build_model")


def test_json_carries_facts_state_reasons_skips_and_user_marks(plan):
    data = json.loads(plan_json(plan))
    assert data["schema"] == "flexgraph.plan/2"
    by_name = {s["name"]: s for s in data["steps"]}
    assert by_name["engine"]["gives"] == ["in_engine"]
    assert by_name["engine"]["ends"] == ["unwrapped"]
    assert by_name["engine"]["state"] == ["in_engine", "initialised", "whole"]
    assert by_name["count"]["origin"] == "user" and by_name["count"]["user"] is True
    assert by_name["count"]["needs"] == ["loaded"]
    assert by_name["freeze"]["origin"]["action"] == "placed"
    assert by_name["freeze"]["origin"]["strategy"] == "need"
    assert by_name["freeze"]["origin"]["index"] is None
    assert by_name["init_weights"]["origin"] == "base" and by_name["init_weights"]["user"] is False
    assert [(r["index"], r["applied"], r["skipped"]) for r in data["rewrites"]] == [
        (0, True, None), (1, True, None), (2, False, "compile is not planned"),
        (3, False, "init_weights is planned"),
    ]
    assert data["rewrites"][1]["why"] == "weights go in through the engine"
    assert data["rewrites"][3]["steps"] == ["build_model", "init_weights"]


def test_a_users_anchors_imply_needs_the_json_names():
    user = Step("freeze", "mine:freeze", updates="model", after="load_checkpoint",
                before="wrap_model", user="custom_steps")
    plan = make_plan(Graph.of(steps(), inputs=["cfg"]).extend([user]))
    by_name = {s["name"]: s for s in plan_to_dict(plan)["steps"]}
    assert by_name["freeze"]["implied_needs"] == ["initialised", "loaded", "unwrapped", "whole"]
    assert by_name["freeze"]["needs"] == [] and by_name["freeze"]["state"] == [
        "initialised", "loaded", "unwrapped", "whole"]


def test_one_numbering_across_the_views(plan, plain):
    numbers = {f"engine #{r.index + 1}" for r in plan.rewrites}
    assert numbers == {"engine #1", "engine #2", "engine #3", "engine #4"}
    for view in (plain(plan_table(plan), width=200), plain(plan_diff(plan), width=200)):
        assert all(number in view for number in numbers)
    assert {f"engine #{r['index'] + 1}" for r in plan_to_dict(plan)["rewrites"]} == numbers


def test_resume_reads_a_saved_plan_of_either_schema(plan):
    current = plan_to_dict(plan)
    old = {"schema": "flexgraph.plan/1", "strategy": "engine",
           "steps": [{k: v for k, v in s.items()
                      if k in ("name", "fn", "requires", "provides", "updates", "after",
                               "before", "params", "stage")}
                     | {"origin": "base"} for s in current["steps"]],
           "stages": current["stages"]}
    assert plan_changes(old, current) == {}
    old["steps"][0]["fn"] = "m:older"
    assert plan_changes(old, current) == {current["steps"][0]["name"]: "replaced"}
    assert plan_change_view(old, current) is not None
    assert plan_change_view(current, current) is None
