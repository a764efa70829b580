"""Shared helpers for the engine tests: terse steps, a training-shaped graph, plan checks."""

from __future__ import annotations

from flexgraph import Graph, Plan, Step


def mk(name: str, **fields: object) -> Step:
    """A step whose function is never run: only its interface matters."""
    return Step(name, f"tests:{name}", **fields)


def training_like() -> Graph:
    """The shape of the standard training graph, with fake functions."""
    return Graph.of(
        [
            mk("build_model", requires="cfg", provides="model"),
            mk("init_weights", updates="model"),
            mk("load_checkpoint", updates="model"),
            mk("wrap_model", updates="model"),
            mk("build_optim_wrapper", requires="model", provides="optim_wrapper"),
            mk("build_param_schedulers", requires="optim_wrapper", provides="param_schedulers"),
            mk("train", requires=("model", "optim_wrapper", "param_schedulers")),
        ],
        inputs=["cfg"],
    )


def check_plan(plan: Plan) -> None:
    """What every valid plan guarantees about its order, edges and stages."""
    names = plan.graph.names
    assert sorted(plan.order) == sorted(names)
    assert len(set(plan.order)) == len(plan.order)
    at = {n: i for i, n in enumerate(plan.order)}
    stage_of = {n: i for i, stage in enumerate(plan.stages) for n in stage}
    assert sorted(stage_of) == sorted(names)
    for edge in plan.graph.edges():
        assert at[edge.source] < at[edge.target], edge
        assert stage_of[edge.source] < stage_of[edge.target], edge
    for edge in plan.edges:
        assert at[edge.source] < at[edge.target], edge
    for i, stage in enumerate(plan.stages):
        assert list(stage) == sorted(stage, key=plan.graph.position.__getitem__)
        for name in stage if i else ():  # generations: each has a parent one stage up
            assert any(stage_of[e.source] == i - 1 for e in plan.edges if e.target == name)
