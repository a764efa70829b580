"""The standard graph's declarations match the step functions they name."""

from __future__ import annotations

import inspect

from flexgraph.core.step import resolve_fn
from flexgraph.training.graph import standard_graph


def test_every_declared_step_accepts_exactly_its_inputs_and_params():
    graph = standard_graph({"compile": {"backend": "eager"}})
    assert "compile" in graph.names
    for step in graph:
        fn = resolve_fn(step.fn)
        parameters = inspect.signature(fn).parameters
        inputs = [n for n, p in parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
        keyword_only = {n for n, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
        assert sorted(inputs) == sorted(step.inputs), step.name
        assert set(step.params) <= keyword_only, step.name
        assert all(parameters[n].default is not inspect.Parameter.empty
                   for n in keyword_only), step.name
