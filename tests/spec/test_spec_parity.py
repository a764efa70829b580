"""One pipeline, three front ends: the textstats examples plan and run identically.

``examples/textstats.yaml`` (YAML), ``textstats_pipeline.py`` (Python API) and
``textstats_cfg.py`` (MMEngine-style config, with a ``custom_steps`` entry) must
give the same plan: order, stages, origins and rewrites, with the strategy
they choose and without one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flexgraph import Executor, Plan
from flexgraph.spec import Spec, load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FRONT_ENDS = ["textstats.yaml", "textstats_pipeline.py", "textstats_cfg.py"]

EXPECTED_ORDER = (
    "load_text", "tokenize", "lowercase", "fold_accents", "drop_stopwords",
    "strip_punctuation", "count_words", "top_words", "report",
)


def summary(plan: Plan) -> dict[str, object]:
    return {
        "strategy": plan.strategy,
        "order": plan.order,
        "stages": plan.stages,
        "base_order": plan.base_order,
        "origins": {n: plan.origin(n) for n in plan.order},
        "rewrites": [(r.index, r.strategy, r.kind, r.description, dict(r.touched))
                     for r in plan.rewrites],
        "edges": sorted((e.source, e.target, e.reason) for e in plan.edges),
        "chains": dict(plan.graph.chains),
        "inputs": sorted(plan.graph.inputs),
    }


@pytest.fixture(scope="module")
def specs() -> dict[str, Spec]:
    return {name: load_spec(EXAMPLES / name) for name in FRONT_ENDS}


def test_the_three_front_ends_plan_identically(specs: dict[str, Spec]) -> None:
    plans = {name: summary(spec.plan()) for name, spec in specs.items()}
    yaml_plan = plans["textstats.yaml"]
    assert yaml_plan["order"] == EXPECTED_ORDER
    assert yaml_plan["strategy"] == "lowercase_first"
    for name in FRONT_ENDS[1:]:
        assert plans[name] == yaml_plan, name


def test_the_three_front_ends_give_byte_identical_plan_json(specs: dict[str, Spec]) -> None:
    """Functions, params and edges included: the JSON view is the whole plan.

    The config adds ``strip_punctuation`` through ``custom_steps``, so its plan
    marks that step the user's; nothing else differs.
    """
    import json

    from flexgraph.render import plan_json

    texts = {name: plan_json(spec.plan()) for name, spec in specs.items()}
    assert texts["textstats_pipeline.py"] == texts["textstats.yaml"]
    from_cfg = json.loads(texts["textstats_cfg.py"])
    (custom,) = [s for s in from_cfg["steps"] if s["user"]]
    assert (custom["name"], custom["origin"]) == ("strip_punctuation", "user")
    custom.update(user=False, origin="base")
    assert json.dumps(from_cfg, indent=2) == texts["textstats.yaml"]


@pytest.mark.parametrize("chosen", ["lowercase_first", {"type": "lowercase_first"}])
def test_they_agree_when_the_caller_picks_the_strategy(
    specs: dict[str, Spec], chosen: object
) -> None:
    plans = [summary(spec.plan(chosen)) for spec in specs.values()]
    assert plans[0] == plans[1] == plans[2]


def test_the_base_graphs_agree(specs: dict[str, Spec]) -> None:
    graphs = [spec.graph for spec in specs.values()]
    assert [g.names for g in graphs] == [graphs[0].names] * 3
    assert [dict(g.chains) for g in graphs] == [dict(graphs[0].chains)] * 3
    assert graphs[0].chains["tokens"] == ("drop_stopwords", "lowercase", "strip_punctuation")


def test_the_strategy_moves_an_updater_inserts_a_step_and_configures_one(
    specs: dict[str, Spec],
) -> None:
    plan = specs["textstats.yaml"].plan()
    assert [str(plan.origin(n)) for n in ("lowercase", "fold_accents", "top_words")] == [
        "moved by lowercase_first #1: move lowercase before drop_stopwords",
        "inserted by lowercase_first #2: insert fold_accents after lowercase",
        "configured by lowercase_first #3: configure top_words: n=2",
    ]


def test_inputs_agree_and_cfg_adds_its_config(specs: dict[str, Spec]) -> None:
    documents = {spec.inputs["document"] for spec in specs.values()}
    assert len(documents) == 1
    assert specs["textstats_cfg.py"].cfg is not None
    assert specs["textstats_cfg.py"].inputs["cfg"] is specs["textstats_cfg.py"].cfg


def test_the_three_plans_run_to_the_same_result(specs: dict[str, Spec]) -> None:
    results = set()
    for spec in specs.values():
        context = Executor().run(spec.plan(), dict(spec.inputs)).context
        results.add(context["summary"])
    assert results == {"12 words, 10 distinct; top: cafe (3), best (1)"}


def test_the_strategy_changes_the_result(specs: dict[str, Spec]) -> None:
    spec = specs["textstats.yaml"]
    from flexgraph import make_plan

    base = Executor().run(make_plan(spec.graph), dict(spec.inputs)).context["summary"]
    assert base.startswith("14 words")  # "the" survives when stop words are dropped first


@pytest.mark.slow
def test_the_python_example_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "textstats_pipeline.py")],
        capture_output=True, text=True, check=True,
    )
    assert result.stdout.splitlines() == [
        "order: " + " -> ".join(EXPECTED_ORDER),
        "12 words, 10 distinct; top: cafe (3), best (1)",
    ]
