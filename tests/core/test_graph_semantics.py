"""Graph semantics: which edges a set of steps implies, and how graphs compose.

The rules (flexgraph.core.graph): producer -> updaters in chain order ->
consumers; a consumer ordered before an updater follows only the updaters ahead
of it; explicit after/before edges; steps declared together chain in list order.
"""

from __future__ import annotations

import pytest

from flexgraph import AmbiguousOrderError, DuplicateStepError, Graph, make_plan
from tests.core.engine_helpers import mk, training_like


def edge_set(graph: Graph) -> set[tuple[str, str]]:
    return {(e.source, e.target) for e in graph.edges()}


def test_producer_feeds_the_first_updater_and_updaters_chain_in_list_order() -> None:
    g = training_like()
    assert g.chains["model"] == ("init_weights", "load_checkpoint", "wrap_model")
    edges = edge_set(g)
    assert ("build_model", "init_weights") in edges
    assert ("init_weights", "load_checkpoint") in edges
    assert ("load_checkpoint", "wrap_model") in edges


def test_consumers_follow_the_last_updater_only() -> None:
    edges = edge_set(training_like())
    assert ("wrap_model", "build_optim_wrapper") in edges
    assert ("build_model", "build_optim_wrapper") not in edges
    assert ("init_weights", "build_optim_wrapper") not in edges


def test_every_edge_says_why_it_exists() -> None:
    reasons = {(e.source, e.target): e.reason for e in training_like().edges()}
    assert reasons["build_model", "init_weights"] == (
        "init_weights updates model, made by build_model"
    )
    assert reasons["init_weights", "load_checkpoint"] == (
        "load_checkpoint updates model after init_weights"
    )
    assert reasons["wrap_model", "build_optim_wrapper"] == (
        "build_optim_wrapper requires model, last updated by wrap_model"
    )


def test_a_consumer_ordered_before_an_updater_follows_only_the_ones_ahead() -> None:
    g = training_like().add(mk("peek", requires="model", before="wrap_model"))
    edges = edge_set(g)
    assert ("load_checkpoint", "peek") in edges
    assert ("peek", "wrap_model") in edges
    assert ("wrap_model", "peek") not in edges
    order = make_plan(g).order
    assert order.index("load_checkpoint") < order.index("peek") < order.index("wrap_model")


def test_a_consumer_before_the_first_updater_follows_the_producer() -> None:
    g = training_like().add(mk("peek", requires="model", before="init_weights"))
    edges = edge_set(g)
    assert ("build_model", "peek") in edges
    assert ("peek", "init_weights") in edges


def test_an_updater_saying_after_a_consumer_also_cuts_the_chain() -> None:
    g = Graph.of(
        [mk("make", provides="x"), mk("read", requires="x"), mk("change", updates="x",
                                                                 after="read")]
    )
    assert edge_set(g) == {("make", "change"), ("read", "change"), ("make", "read")}


def test_explicit_edges_are_edges() -> None:
    g = Graph.of([mk("a"), mk("b", after="a"), mk("c", before="a")])
    assert edge_set(g) == {("a", "b"), ("c", "a")}
    assert make_plan(g).order == ("c", "a", "b")


def test_explicit_edges_among_updaters_declared_together_win_over_list_order() -> None:
    g = Graph.of([mk("make", provides="x"), mk("u1", updates="x"), mk("u2", updates="x",
                                                                       before="u1")])
    assert g.chains["x"] == ("u2", "u1")


def test_an_added_updater_must_say_where_it_goes() -> None:
    with pytest.raises(AmbiguousOrderError, match="'freeze' and 'wrap_model' both update 'model'"):
        training_like().add(mk("freeze", updates="model"))


@pytest.mark.parametrize(
    ("anchor", "chain"),
    [
        ({"after": "load_checkpoint"}, ("init_weights", "load_checkpoint", "freeze",
                                        "wrap_model")),
        ({"before": "load_checkpoint"}, ("init_weights", "freeze", "load_checkpoint",
                                         "wrap_model")),
    ],
)
def test_an_added_updater_is_spliced_next_to_its_anchor(anchor: dict, chain: tuple) -> None:
    g = training_like().extend([mk("freeze", updates="model", **anchor)])
    assert g.chains["model"] == chain
    assert g.names[-1] == "freeze"


def test_extend_declares_new_steps_together_and_anchors_the_first() -> None:
    g = training_like().extend(
        [mk("freeze", updates="model", after="load_checkpoint"), mk("unfreeze", updates="model")]
    )
    assert g.chains["model"] == (
        "init_weights", "load_checkpoint", "freeze", "unfreeze", "wrap_model"
    )


def test_union_merges_steps_inputs_and_chains() -> None:
    left = Graph.of([mk("make", provides="x")])
    right = Graph.of([mk("use", requires=("x", "y"))], inputs=["y"])
    both = left | right
    assert both.names == ("make", "use")
    assert both.inputs == {"y"}
    with pytest.raises(DuplicateStepError, match="both have step 'make'"):
        left | left


def test_remove_drops_the_step_its_chain_places_and_references_to_it() -> None:
    g = training_like().add(mk("log", after="load_checkpoint", before="wrap_model"))
    smaller = g.remove("load_checkpoint")
    assert "load_checkpoint" not in smaller
    assert smaller.chains["model"] == ("init_weights", "wrap_model")
    assert smaller.by_name["log"].after == ()
    assert smaller.by_name["log"].before == ("wrap_model",)
    assert "load_checkpoint" in g  # graphs are values: the original is unchanged


def test_upstream_keeps_a_target_and_everything_it_depends_on() -> None:
    g = training_like().add(mk("eval", requires="model", after="wrap_model"))
    up = g.upstream("build_optim_wrapper")
    assert up.names == (
        "build_model", "init_weights", "load_checkpoint", "wrap_model", "build_optim_wrapper"
    )
    assert up.inputs == {"cfg"}


def test_with_inputs_adds_outside_artifacts() -> None:
    g = Graph.of([mk("use", requires="x")])
    assert g.with_inputs("x").inputs == {"x"}
    assert g.inputs == frozenset()


def test_digraph_joins_the_reasons_of_parallel_edges() -> None:
    g = Graph.of([mk("make", provides=("x", "y")), mk("use", requires=("x", "y"))])
    assert g.digraph().edges["make", "use"]["reason"] == "use requires x; use requires y"
