"""The standard graph's declarations match the step functions they name."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

from flexgraph import Prune, get_strategy, make_plan
from flexgraph.core.step import resolve_fn
from flexgraph.training.graph import ENTRIES, standard_graph


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


# -- steps never read the hooks' runner view --------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
STEP_MODULES = [ROOT / "flexgraph" / "training" / "steps.py",
                *sorted((ROOT / "strategies").glob("**/steps.py"))]


def _reads_of_runner(tree: ast.AST) -> list[int]:
    """Lines where ``tree`` reaches a ``runner``: ``x.runner`` or ``getattr(x, "runner")``."""
    return sorted({node.lineno for node in ast.walk(tree)
                   if (isinstance(node, ast.Attribute) and node.attr == "runner")
                   or (isinstance(node, ast.Constant) and node.value == "runner")})


def _planned_functions() -> set[str]:
    """Every ``module:function`` a plan of the standard graph names, under each built-in
    strategy (each ZeRO stage, with and without ``init_weights``), for each entry."""
    strategies = [None, get_strategy("single"), get_strategy("ddp"), get_strategy("fsdp"),
                  *(get_strategy("deepspeed", zero_optimization={"stage": stage})
                    for stage in range(4))]
    refs = set()
    for entry in ENTRIES:
        graph = standard_graph({"compile": True}, entry=entry)
        for strategy in strategies:
            for derived in ((), (Prune("init_weights", "the files cover the model"),)):
                plan = make_plan(graph, strategy, targets=(entry,), derived=derived)
                refs.update(step.fn for step in plan.steps if isinstance(step.fn, str))
    return refs


def _function_node(ref: str) -> ast.AST:
    """The source of the function ``ref`` names, parsed (a re-export followed)."""
    return ast.parse(textwrap.dedent(inspect.getsource(resolve_fn(ref))))


def test_no_step_function_reads_the_hooks_runner_view():
    """Steps show hooks the artifacts (``hooks.hold``) and take what they need as
    artifacts, or from ``run_context`` and ``settings``; the runner view is the hooks'."""
    assert len(STEP_MODULES) >= 3, STEP_MODULES
    found = {str(path.relative_to(ROOT)): _reads_of_runner(ast.parse(path.read_text()))
             for path in STEP_MODULES}
    assert {module: lines for module, lines in found.items() if lines} == {}
    planned = _planned_functions()
    assert {"flexgraph.training.steps:train", "flexgraph.strategies.deepspeed.steps:initialize",
            "flexgraph.strategies.ddp:wrap_ddp"} <= planned
    readers = {ref: _reads_of_runner(_function_node(ref)) for ref in sorted(planned)}
    assert {ref: lines for ref, lines in readers.items() if lines} == {}
