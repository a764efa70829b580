"""Validation of a graph, run after every rewrite so a broken graph is caught at its rewrite."""

from __future__ import annotations

import networkx as nx

from flexgraph.core.errors import did_you_mean
from flexgraph.core.graph import (
    CycleError,
    DuplicateProducerError,
    Graph,
    GraphError,
    MissingInputError,
    derive_edges,
    unknown_step,
)


def validate(graph: Graph) -> nx.DiGraph:
    """Check ``graph`` (see :mod:`flexgraph.core.graph` for the errors) and return its DAG."""
    check(graph)
    return graph.digraph()


def check(graph: Graph) -> None:
    """Check ``graph`` as :func:`validate` does, without building the DAG."""
    _check_ordering_names(graph)
    _check_producers(graph)
    _check_inputs(graph)
    _check_chains(graph)
    if _has_cycle(graph.names, derive_edges(graph, _pair)):
        raise CycleError(_describe_cycle(graph.digraph()))


def _pair(source: str, target: str, reason: str) -> tuple[str, str]:
    del reason
    return source, target


def _has_cycle(names: tuple[str, ...], edges: list[tuple[str, str]]) -> bool:
    """Kahn's algorithm on plain dicts: whether some step is never freed."""
    successors: dict[str, list[str]] = {n: [] for n in names}
    waiting = dict.fromkeys(names, 0)
    for source, target in edges:
        successors[source].append(target)
        waiting[target] += 1
    ready = [n for n, count in waiting.items() if count == 0]
    freed = 0
    while ready:
        name = ready.pop()
        freed += 1
        for target in successors[name]:
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
    return freed < len(names)


def _check_ordering_names(graph: Graph) -> None:
    for s in graph.steps:
        for field in ("after", "before"):
            for ref in getattr(s, field):
                if ref not in graph:
                    raise unknown_step(ref, graph.names, f"step {s.name!r} says {field}={ref!r}")


def _check_producers(graph: Graph) -> None:
    seen: dict[str, str] = {}
    for s in graph.steps:
        for artifact in s.provides:
            if artifact in graph.inputs:
                raise DuplicateProducerError(
                    f"artifact {artifact!r} is a graph input and is also provided by step "
                    f"{s.name!r}; drop one of them"
                )
            if artifact in seen:
                raise DuplicateProducerError(
                    f"artifact {artifact!r} is provided by both {seen[artifact]!r} and {s.name!r}; "
                    "remove one, or make the second one update it instead"
                )
            seen[artifact] = s.name


def _check_inputs(graph: Graph) -> None:
    available = set(graph.producers) | graph.inputs
    for s in graph.steps:
        for artifact in s.inputs:
            if artifact not in available:
                hint = did_you_mean(artifact, available)
                raise MissingInputError(
                    f"step {s.name!r} needs artifact {artifact!r}, which no step provides "
                    f"and no input supplies{hint}"
                )


def _check_chains(graph: Graph) -> None:
    """The chains must list exactly the updaters: a broken invariant is our bug."""
    for s in graph.steps:
        for artifact in s.updates:
            if s.name not in graph.chains.get(artifact, ()):
                raise GraphError(f"internal: {s.name!r} updates {artifact!r} but is not chained")
    for artifact, chain in graph.chains.items():
        for name in chain:
            if name not in graph or artifact not in graph.by_name[name].updates:
                raise GraphError(f"internal: chain of {artifact!r} lists {name!r}")


def _describe_cycle(dag: nx.DiGraph) -> str:
    cycle = nx.find_cycle(dag)
    path = " -> ".join([cycle[0][0]] + [target for _, target in cycle])
    reasons = "; ".join(dag.edges[u, v]["reason"] for u, v in cycle)
    return f"cycle: {path} ({reasons})"
