"""The executor: hooks around each step, records, failures, dry runs, inputs."""

from __future__ import annotations

from typing import Any

import pytest

from flexgraph import (
    Executor,
    Graph,
    Insert,
    MissingInputError,
    Step,
    StepFailedError,
    StepOutputError,
    Strategy,
    make_plan,
    step,
)


@step(provides="text")
def load(document: str) -> str:
    return document.strip()


@step(provides="words")
def split(text: str) -> list[str]:
    return text.split()


@step(updates="words")
def upper(words: list[str]) -> list[str]:
    return [w.upper() for w in words]


@step(provides="count")
def count(words: list[str]) -> int:
    return len(words)


GRAPH = Graph.of([load, split, upper, count], inputs=["document"])


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def before_step(self, step: Step, context: Any) -> None:
        self.events.append(("before", step.name))

    def after_step(self, step: Step, context: Any, record: Any) -> None:
        assert record.status == "ok"
        self.events.append(("after", step.name))

    def on_error(self, step: Step, context: Any, error: BaseException) -> None:
        self.events.append(("error", step.name))


def test_runs_the_plan_and_returns_the_context() -> None:
    result = Executor().run(make_plan(GRAPH), {"document": " a b c "})
    assert result.context["words"] == ["A", "B", "C"]
    assert result.context["count"] == 3


def test_hooks_fire_around_each_step_in_plan_order() -> None:
    recorder = Recorder()
    Executor([recorder, object()]).run(make_plan(GRAPH), {"document": "x"})
    assert recorder.events == [
        (point, name) for name in ("load", "split", "upper", "count")
        for point in ("before", "after")
    ]


def test_records_say_what_ran_where_it_came_from_and_what_it_cost() -> None:
    strategy = Strategy("s", [Insert(Step("noop", lambda: None), after="load")])
    result = Executor().run(make_plan(GRAPH, strategy), {"document": "x"})
    assert [r.name for r in result.records] == ["load", "noop", "split", "upper", "count"]
    assert all(r.status == "ok" and r.seconds >= 0 for r in result.records)
    assert all(r.peak_rss_mib and r.peak_rss_mib > 0 for r in result.records)
    assert result.records[1].origin == "inserted by s #1"


def test_a_failure_names_the_step_and_its_origin_and_chains_the_cause() -> None:
    def explode(words: list[str]) -> list[str]:
        raise ZeroDivisionError("no words")

    strategy = Strategy("s", [Insert(Step("explode", explode, updates="words"), after="upper")])
    recorder = Recorder()
    with pytest.raises(StepFailedError) as info:
        Executor([recorder]).run(make_plan(GRAPH, strategy), {"document": "x"})
    error = info.value
    assert str(error) == (
        "step 'explode' (inserted by s #1: insert explode after upper) failed: "
        "ZeroDivisionError: no words"
    )
    assert isinstance(error.__cause__, ZeroDivisionError)
    assert (error.step, error.origin) == ("explode", "inserted by s #1: insert explode after upper")
    assert recorder.events[-2:] == [("before", "explode"), ("error", "explode")]


def test_a_dry_run_runs_nothing_but_checks_inputs() -> None:
    recorder = Recorder()
    result = Executor([recorder]).run(make_plan(GRAPH), {"document": "x"}, dry_run=True)
    assert recorder.events == []
    assert [r.status for r in result.records] == ["planned"] * 4
    assert result.context == {"document": "x"}
    with pytest.raises(MissingInputError):
        Executor().run(make_plan(GRAPH), {}, dry_run=True)


def test_a_missing_input_is_named_with_a_did_you_mean() -> None:
    with pytest.raises(MissingInputError, match=r"needs input 'document', which the run was not "
                       r"given \(did you mean 'documents'\?\)"):
        Executor().run(make_plan(GRAPH), {"documents": "x"})


def test_several_outputs_come_back_as_a_mapping_or_a_tuple() -> None:
    both = Step("both", lambda: (1, 2), provides=("a", "b"))
    named = Step("named", lambda: {"c": 3, "d": 4}, provides=("c", "d"))
    context = Executor().run(make_plan(Graph.of([both, named]))).context
    assert (context["a"], context["b"], context["c"], context["d"]) == (1, 2, 3, 4)


def test_a_return_value_that_does_not_match_the_outputs_fails_the_step() -> None:
    bad = Step("bad", lambda: {"x": 1}, provides=("a", "b"))
    with pytest.raises(StepFailedError) as info:
        Executor().run(make_plan(Graph.of([bad])))
    assert isinstance(info.value.__cause__, StepOutputError)
    assert "returned keys ['x'], expected ['a', 'b']" in str(info.value)


def test_params_are_passed_as_keyword_arguments() -> None:
    scaled = Step("scale", lambda x, factor: x * factor, requires="x", provides="y",
                  params={"factor": 3})
    assert Executor().run(make_plan(Graph.of([scaled], inputs=["x"])), {"x": 2}).context["y"] == 6


def test_string_functions_are_resolved_only_when_run() -> None:
    graph = Graph.of([Step("dumps", "json:dumps", requires="obj", provides="text")],
                     inputs=["obj"])
    plan = make_plan(graph)
    assert Executor().run(plan, {"obj": [1]}).context["text"] == "[1]"


def test_each_records_peak_is_the_high_water_mark_never_below_its_resident_memory() -> None:
    big = Step("big", lambda: bytearray(64 * 2**20), provides="buffer")
    drop = Step("drop", lambda buffer: None, requires="buffer")
    result = Executor().run(make_plan(Graph.of([big, drop])), {})
    for record in result.records:
        assert record.peak_rss_mib >= record.rss_mib, record
    first, second = result.records
    assert second.peak_rss_mib >= first.peak_rss_mib >= first.rss_mib
