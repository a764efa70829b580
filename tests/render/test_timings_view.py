"""timings_table: the executor's step records, with a total row."""

from __future__ import annotations

from flexgraph import Executor, Graph, StepRecord, make_plan, step
from flexgraph.render import timings_table


def test_columns_rows_and_total(plain):
    records = [
        StepRecord("build_model", "base", "ok", 1.25, 100.0, 120.5),
        StepRecord("wrap_model", "replaced by ddp #1: replace ...", "ok", 0.5, 110.0, 130.0),
        StepRecord("train", "base", "failed", 2.0, None, None),
    ]
    table = timings_table(records)
    assert [str(c.header) for c in table.columns] == [
        "step", "origin", "status", "seconds", "rss MiB", "peak RSS MiB",
    ]
    assert table.row_count == 4
    lines = plain(table).splitlines()
    assert lines[-1].split() == ["total", "2/3", "ok", "3.750", "130.0"]
    train = next(line for line in lines if line.startswith("train"))
    assert train.split() == ["train", "base", "failed", "2.000", "-", "-"]


def test_a_dry_run_shows_every_step_planned(plain):
    @step(provides="y")
    def double(x):
        return 2 * x

    plan = make_plan(Graph.of([double], inputs=["x"]))
    result = Executor().run(plan, {"x": 1}, dry_run=True)
    lines = plain(timings_table(result.records)).splitlines()
    assert next(line for line in lines if line.startswith("double")).split()[2] == "planned"
    assert lines[-1].split() == ["total", "0/1", "ok", "0.000", "-"]


def test_records_of_a_real_run(plain):
    @step(provides="y")
    def double(x):
        return 2 * x

    plan = make_plan(Graph.of([double], inputs=["x"]))
    records = Executor().run(plan, {"x": 1}).records
    row = next(line for line in plain(timings_table(records)).splitlines()
               if line.startswith("double"))
    assert row.split()[1:3] == ["base", "ok"]
