"""Hypothesis generator of graphs that are valid by construction.

It draws a hidden topological order first and only ever adds edges that point
forward in it: producers before updaters before consumers (or a consumer
ordered ``before`` the first updater it must precede), explicit after/before
from earlier to later steps. Declaration order is either that hidden order or
a shuffle of it, with the updaters of each artifact then chained by ``after``.
"""

from __future__ import annotations

from hypothesis import strategies as st

from flexgraph import Graph
from tests.core.engine_helpers import mk


@st.composite
def random_graph(draw: st.DrawFn, max_steps: int = 12) -> Graph:
    """A valid graph: steps in a hidden order, every derived edge pointing forward."""
    n = draw(st.integers(1, max_steps))
    names = [f"s{i}" for i in range(n)]
    fields: list[dict[str, list[str]]] = [
        {"requires": [], "provides": [], "updates": [], "after": [], "before": []}
        for _ in range(n)
    ]
    inputs = []
    chain_edges = draw(st.booleans())
    for a in range(draw(st.integers(0, 6))):
        artifact = f"a{a}"
        producer = draw(st.integers(-1, n - 1))  # -1: a graph input
        if producer < 0:
            inputs.append(artifact)
        else:
            fields[producer]["provides"].append(artifact)
        later = list(range(producer + 1, n))
        updaters = sorted(draw(st.sets(st.sampled_from(later), max_size=3))) if later else []
        for i in updaters:
            fields[i]["updates"].append(artifact)
        if chain_edges:
            for first, second in zip(updaters, updaters[1:], strict=False):
                fields[second]["after"].append(names[first])
        taken = {producer, *updaters}
        free = [i for i in later if i not in taken]
        for i in sorted(draw(st.sets(st.sampled_from(free), max_size=3))) if free else []:
            ahead = [u for u in updaters if u > i]
            if ahead:
                fields[i]["before"].append(names[ahead[0]])
            fields[i]["requires"].append(artifact)
    for _ in range(draw(st.integers(0, 4))):
        if n < 2:
            break
        i, j = sorted(draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True)))
        key = "after" if draw(st.booleans()) else "before"
        if key == "after" and names[i] not in fields[j]["after"]:
            fields[j]["after"].append(names[i])
        elif key == "before" and names[j] not in fields[i]["before"]:
            fields[i]["before"].append(names[j])
    steps = [mk(names[i], **fields[i]) for i in range(n)]
    if not chain_edges:  # declared in hidden order, so list order chains the updaters
        return Graph.of(steps, inputs=inputs)
    order = draw(st.permutations(range(n)))
    return Graph.of([steps[i] for i in order], inputs=inputs)
