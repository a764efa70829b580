"""plan_json: the stable ``flexgraph.plan/2`` schema."""

from __future__ import annotations

import json
import math

import pytest

from flexgraph import Configure, Graph, Step, Strategy, make_plan
from flexgraph.render import SCHEMA, plan_json, plan_to_dict
from flexgraph.render.json_view import json_safe
from tests.render.demo_plan import base_graph, demo_strategy

TOP_KEYS = ["schema", "strategy", "steps", "rewrites", "stages", "base_order", "edges"]
STEP_KEYS = [
    "name", "fn", "requires", "provides", "updates", "after", "before", "params", "stage",
    "origin", "user", "gives", "ends", "needs", "implied_needs", "state",
]
REWRITE_KEYS = ["index", "strategy", "kind", "description", "touched", "consumed", "why",
                "applied", "skipped", "steps"]


def test_top_level_keys_in_schema_order(plan):
    data = json.loads(plan_json(plan))
    assert list(data) == TOP_KEYS
    assert data["schema"] == SCHEMA == "flexgraph.plan/2"
    assert data["strategy"] == "demo"


def test_strategy_is_null_without_one(base_plan):
    data = plan_to_dict(base_plan)
    assert data["strategy"] is None
    assert data["rewrites"] == []
    assert all(step["origin"] == "base" for step in data["steps"])


def test_steps_in_plan_order_with_every_field(plan):
    steps = plan_to_dict(plan)["steps"]
    assert [s["name"] for s in steps] == list(plan.order)
    for step in steps:
        assert list(step) == STEP_KEYS
    train = steps[-1]
    assert train["fn"] == "demo.steps:train"
    assert train["requires"] == ["model", "optim_wrapper", "param_schedulers"]
    assert train["params"] == {"max_epochs": 2}


def test_origin_is_base_or_the_rewrite_that_placed_the_step(plan):
    origins = {s["name"]: s["origin"] for s in plan_to_dict(plan)["steps"]}
    assert origins["setup_env"] == "base"
    assert origins["shard_model"] == {
        "action": "replaced",
        "strategy": "demo",
        "index": 2,
        "rewrite": "replace wrap_model with shard_model (demo.steps:shard_model)",
    }
    assert {o["action"] for o in origins.values() if o != "base"} == {
        "inserted", "moved", "replaced", "fused", "configured",
    }


def test_rewrites_in_order_with_what_they_touched(plan):
    rewrites = plan_to_dict(plan)["rewrites"]
    assert [list(r) for r in rewrites] == [REWRITE_KEYS] * 6
    assert [r["kind"] for r in rewrites] == [
        "insert", "move", "replace", "fuse", "configure", "remove",
    ]
    assert [r["index"] for r in rewrites] == list(range(6))
    assert rewrites[5]["touched"] == {"resume": "removed"}
    assert rewrites[5]["consumed"] == {"resume": None}
    assert rewrites[3]["consumed"] == {
        "build_optim_wrapper": "build_optim", "build_param_schedulers": "build_optim",
    }
    assert rewrites[3]["description"] == (
        "fuse build_optim_wrapper, build_param_schedulers into build_optim"
    )


def test_stages_base_order_and_edges(plan):
    data = plan_to_dict(plan)
    assert data["stages"] == [list(s) for s in plan.stages]
    assert [s["stage"] for s in data["steps"]] == list(range(8))
    assert data["base_order"] == list(plan.base_order)
    assert "resume" in data["base_order"]
    edges = {(e["source"], e["target"]): e["reason"] for e in data["edges"]}
    assert len(edges) == len(plan.edges)
    assert edges["build_model", "init_weights"] == "init_weights updates model, made by build_model"
    position = {name: i for i, name in enumerate(plan.order)}
    keys = [(position[e["source"]], position[e["target"]]) for e in data["edges"]]
    assert keys == sorted(keys)


def test_params_that_json_cannot_hold_become_repr():
    class Opaque:
        def __repr__(self):
            return "Opaque()"

    params = {
        "n": 1, "lr": 0.5, "flag": True, "none": None, "name": "x",
        "shape": (2, 3), "nested": {"a": [1, (2,)]}, "obj": Opaque(),
        "inf": math.inf, "tags": {"b", "a"}, "by_int": {1: "x"},
    }
    graph = Graph.of([Step("s", "m:f", provides="x", params=params)])
    step = plan_to_dict(make_plan(graph))["steps"][0]
    assert step["params"] == {
        "n": 1, "lr": 0.5, "flag": True, "none": None, "name": "x",
        "shape": [2, 3], "nested": {"a": [1, [2]]}, "obj": "Opaque()",
        "inf": "inf", "tags": ["a", "b"], "by_int": "{1: 'x'}",
    }
    json.loads(plan_json(make_plan(graph)))  # valid JSON, no NaN/Infinity tokens


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_non_finite_floats_are_strings(value):
    assert json_safe(value) == repr(value)


def test_json_is_indented_and_deterministic(plan):
    text = plan_json(plan)
    assert text.startswith('{\n  "schema": "flexgraph.plan/2",\n')
    assert text == plan_json(plan)


def test_planning_twice_gives_identical_json():
    first = plan_json(make_plan(base_graph(), demo_strategy()))
    second = plan_json(make_plan(base_graph(), demo_strategy()))
    assert first == second


def test_configured_step_shows_bound_params():
    graph = Graph.of([Step("s", "m:f", provides="x", params={"a": 1})])
    plan = make_plan(graph, Strategy("cfg", [Configure("s", {"b": 2})]))
    step = plan_to_dict(plan)["steps"][0]
    assert step["params"] == {"a": 1, "b": 2}
    assert step["origin"]["action"] == "configured"
