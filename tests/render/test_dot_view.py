"""plan_dot: a valid Graphviz digraph of the plan (checked without pydot)."""

from __future__ import annotations

import re

import pydot

from flexgraph import Graph, Step, make_plan
from flexgraph.render import plan_dot
from flexgraph.render.dot import quote

QUOTED = r'"(?:[^"\\]|\\.)*"'
NODE = re.compile(rf"^  ({QUOTED}) \[(.*)\];$")
EDGE = re.compile(rf"^  ({QUOTED}) -> ({QUOTED}) \[(.*)\];$")


def parse(dot: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The declared nodes and the edges of ``plan_dot`` output, checking its shape."""
    lines = dot.splitlines()
    assert lines[0] == "digraph plan {" and lines[-1] == "}"
    assert dot.endswith("}\n")
    nodes, edges = [], []
    for line in lines[1:-1]:
        if edge := EDGE.match(line):
            edges.append((edge[1], edge[2], edge[3]))
        elif node := NODE.match(line):
            nodes.append(node[1])
        else:
            assert re.match(r"^  \w+( \[.*\])?=?.*;$", line), line
    return nodes, edges


def braces_balance(dot: str) -> bool:
    depth = 0
    for char in re.sub(QUOTED, '""', dot):  # braces inside strings do not count
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_is_a_digraph_with_balanced_braces(plan):
    dot = plan_dot(plan)
    assert dot.startswith("digraph plan {\n")
    assert braces_balance(dot)


def test_one_node_per_step_in_plan_order(plan):
    nodes, _ = parse(plan_dot(plan))
    assert nodes == [quote(name) for name in plan.order]


def test_every_edge_endpoint_is_declared_and_every_edge_drawn(plan):
    nodes, edges = parse(plan_dot(plan))
    assert {(s, t) for s, t, _ in edges} == {(quote(e.source), quote(e.target)) for e in plan.edges}
    assert len(edges) == len(plan.edges)
    for source, target, _ in edges:
        assert source in nodes and target in nodes


def test_node_label_is_name_and_fn(plan):
    assert '"train" [label="train\\ndemo.steps:train"];' in plan_dot(plan)


def test_rewritten_nodes_are_styled_by_action(plan):
    dot = plan_dot(plan)
    line = {name: next(x for x in dot.splitlines() if x.startswith(f"  {quote(name)} ["))
            for name in plan.order}
    assert "fillcolor" not in line["train"]
    styles = {
        name: re.search(r'fillcolor="([^"]+)"', line[name])[1]
        for name in ("freeze_backbone", "load_checkpoint", "shard_model", "build_optim",
                     "build_model")
    }
    assert len(set(styles.values())) == 5  # one colour per action
    assert "peripheries=2" in line["build_optim"]
    assert "dashed" in line["load_checkpoint"]
    assert 'tooltip="inserted by demo #1: insert freeze_backbone after init_weights"' in (
        line["freeze_backbone"]
    )


def test_edges_are_labelled_with_the_artifact(plan):
    dot = plan_dot(plan)
    assert '"setup_env" -> "build_model" [label="env"' in dot
    assert '"build_optim" -> "train" [label="optim_wrapper, param_schedulers"' in dot


def test_ordering_edges_are_dashed_and_unlabelled():
    graph = Graph.of([Step("a", "m:a"), Step("b", "m:b", after="a")])
    dot = plan_dot(make_plan(graph))
    assert '"a" -> "b" [style="dashed", tooltip="b says after=a"];' in dot


def test_odd_names_are_quoted_and_escaped():
    weird = 'mod:f"quoted"\\back{slash}'
    dot = plan_dot(make_plan(Graph.of([Step("a", weird, provides="x")])))
    assert braces_balance(dot)
    assert r'label="a\nmod:f\"quoted\"\\back{slash}"' in dot
    nodes, _ = parse(dot)
    assert nodes == ['"a"']


def test_is_deterministic(plan):
    assert plan_dot(plan) == plan_dot(plan)


def test_a_dot_parser_accepts_it(plan):
    """pydot parses DOT with Graphviz's grammar, without needing Graphviz installed."""
    (graph,) = pydot.graph_from_dot_data(plan_dot(plan))
    assert {n.get_name().strip('"') for n in graph.get_nodes()} >= set(plan.order)
    assert len(graph.get_edges()) == len(plan.edges)
