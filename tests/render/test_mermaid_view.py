"""plan_mermaid: a ``flowchart TD`` that GitHub renders."""

from __future__ import annotations

import re

from flexgraph import Graph, Step, make_plan
from flexgraph.render import plan_mermaid
from flexgraph.render.mermaid import escape, node_ids

NODE = re.compile(r'^    (\w+)\["(.*)"\]$')
EDGE = re.compile(r'^    (\w+) (-->\|"[^"]*"\||-\.->) (\w+)$')


def test_starts_with_a_flowchart_header(plan):
    lines = plan_mermaid(plan).splitlines()
    assert lines[0] == "flowchart TD"
    assert lines[1] == "    %% flexgraph plan: demo"


def test_one_node_per_step_in_plan_order(plan):
    nodes = [m[1] for line in plan_mermaid(plan).splitlines() if (m := NODE.match(line))]
    assert nodes == [node_ids(plan)[name] for name in plan.order]
    assert nodes[0] == "s1_setup_env"


def test_one_edge_per_derived_edge(plan):
    ids = node_ids(plan)
    edges = [(m[1], m[3]) for line in plan_mermaid(plan).splitlines() if (m := EDGE.match(line))]
    assert len(edges) == len(plan.edges)
    assert set(edges) == {(ids[e.source], ids[e.target]) for e in plan.edges}


def test_every_line_is_a_known_statement(plan):
    for line in plan_mermaid(plan).splitlines()[2:]:
        assert NODE.match(line) or EDGE.match(line) or re.match(
            r"^    (classDef \w+ \S.*|class [\w,]+ \w+)$", line
        ), line


def test_labels_are_name_and_fn_and_edges_name_artifacts(plan):
    text = plan_mermaid(plan)
    assert 's8_train["train<br/>demo.steps:train"]' in text
    assert 's7_build_optim -->|"optim_wrapper, param_schedulers"| s8_train' in text


def test_a_class_per_action(plan):
    text = plan_mermaid(plan)
    for action, node in [
        ("inserted", "s4_freeze_backbone"),
        ("moved", "s6_load_checkpoint"),
        ("replaced", "s5_shard_model"),
        ("fused", "s7_build_optim"),
        ("configured", "s2_build_model"),
    ]:
        assert f"    classDef {action} " in text
        assert f"    class {node} {action}" in text
    assert "class s1_setup_env" not in text  # base steps keep the default look


def test_ordering_edges_are_dotted():
    text = plan_mermaid(make_plan(Graph.of([Step("a", "m:a"), Step("b", "m:b", after="a")])))
    assert "    s1_a -.-> s2_b" in text


def test_labels_are_escaped_and_ids_stay_safe():
    step = Step("end", 'mod:Outer.<locals>.f"#|', provides="x")
    text = plan_mermaid(make_plan(Graph.of([step])))
    assert 's1_end["end<br/>mod:Outer.#lt;locals#gt;.f#quot;#35;#124;"]' in text
    assert escape("a&b") == "a#amp;b"


def test_is_deterministic(plan):
    assert plan_mermaid(plan) == plan_mermaid(plan)
