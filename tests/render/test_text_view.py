"""plan_table: one row per planned step, with where each came from."""

from __future__ import annotations

import io
import re

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from flexgraph import Graph, Step, make_plan
from flexgraph.render import plan_table
from flexgraph.render import text as text_view
from flexgraph.render._wrap import table_width

COLUMNS = ["#", "stage", "step", "fn", "requires", "provides", "updates", "origin"]


def test_columns_are_the_documented_ones(plan):
    table = plan_table(plan)
    assert isinstance(table, Table)
    assert [str(c.header) for c in table.columns] == COLUMNS


def test_one_row_per_step_in_plan_order(plan):
    table = plan_table(plan)
    assert table.row_count == len(plan.order)
    steps = [str(cell) for cell in table.columns[2].cells]
    assert steps == list(plan.order)


def test_title_names_the_strategy(plan, base_plan):
    assert plan_table(plan).title == "plan: demo"
    assert plan_table(base_plan).title == "plan: base graph (no strategy)"


def test_origins_say_what_the_strategy_did(plan):
    origins = dict(
        zip(plan.order, (str(c) for c in plan_table(plan).columns[7].cells), strict=True)
    )
    assert origins["setup_env"] == "base"
    assert origins["freeze_backbone"] == "inserted by demo #1"
    assert origins["load_checkpoint"] == "moved by demo #2"
    assert origins["shard_model"] == "replaced by demo #3"
    assert origins["build_optim"] == "fused by demo #4"
    assert origins["build_model"] == "configured by demo #5"


def test_base_is_dim_and_actions_are_coloured(plan):
    cells = dict(zip(plan.order, plan_table(plan).columns[7].cells, strict=True))
    assert cells["setup_env"].style == "dim"
    assert {span.style for span in cells["freeze_backbone"].spans} == {"green"}
    assert {span.style for span in cells["build_model"].spans} == {"blue"}


def test_caption_spells_out_each_rewrite(plan, plain):
    out = plain(plan_table(plan))
    assert "8 steps in 8 stages; 6 rewrites applied" in out
    for line in (
        "demo #1: insert freeze_backbone after init_weights",
        "demo #2: move load_checkpoint after wrap_model",
        "demo #3: replace wrap_model with shard_model (demo.steps:shard_model)",
        "demo #4: fuse build_optim_wrapper, build_param_schedulers into build_optim",
        "demo #5: configure build_model: device='meta'",
        "demo #6: remove resume",
    ):
        assert line in out


def test_stage_and_artifacts_are_shown(plan, plain):
    out = plain(plan_table(plan))
    row = next(line for line in out.splitlines() if "build_optim " in line)
    assert row.split()[:3] == ["7", "7", "build_optim"]
    assert "optim_wrapper" in row and "cfg" in row


def test_names_are_text_not_markup(plain):
    # a rich markup tag in a function reference must print as itself
    plan = make_plan(Graph.of([Step("a", "mod:f[bold]", provides="x")]))
    assert "mod:f[bold]" in plain(plan_table(plan))


def test_function_references_stay_whole_when_they_fit(plan, plain):
    assert "demo.steps:build_param_schedulers" not in plain(plan_table(plan), width=120)
    wide = plain(plan_table(plan), width=200)
    assert "demo.steps:setup_env" in wide
    assert "configured by demo #5" in wide


def _identifiers(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def test_no_width_breaks_an_identifier(plan):
    def drawn(width: int) -> str:  # uncropped, as the CLI prints
        console = Console(file=io.StringIO(), width=width, color_system=None)
        console.print(plan_table(plan), crop=False)
        return console.file.getvalue()

    whole = _identifiers(drawn(400))
    whole |= _identifiers("stage and fn left out to fit 40 60 80 100 columns (--explain STEP "
                           "shows a step whole)")
    for width in (40, 60, 80, 100, 120):
        assert _identifiers(drawn(width)) <= whole, width


def test_at_120_columns_references_break_after_a_dot_or_the_colon(plan, plain):
    lines = plain(plan_table(plan), width=120).splitlines()
    row = next(i for i, line in enumerate(lines) if " freeze_backbone " in line)
    assert lines[row].split()[3] == "demo.steps:"
    assert lines[row + 1].split() == ["freeze_backbone"]
    assert max(len(line.rstrip()) for line in lines) <= 120


def test_narrow_terminals_leave_out_fn_then_stage_and_say_so(plan, plain):
    wide = plain(plan_table(plan), width=100).splitlines()
    assert wide[1].split() == [c for c in COLUMNS if c != "fn"]
    assert "fn left out to fit 100 columns" in "\n".join(wide)
    assert max(len(line.rstrip()) for line in wide) <= 100
    narrow = text_view.fit_table(plan, 80)
    assert [str(c.header) for c in narrow.columns] == [c for c in COLUMNS
                                                       if c not in ("fn", "stage")]
    assert table_width(narrow) <= 80


def test_the_stage_column_is_explained(plan, plain):
    out = " ".join(plain(plan_table(plan)).split())
    assert "stage: 1 + the longest chain of steps the step waits for" in out


def test_the_fitted_width_is_what_rich_draws(plan, base_plan):
    console = Console(width=120)
    for each in (plan, base_plan):
        for width in (80, 120, 200):
            table = text_view.fit_table(each, width)
            measured = Measurement.get(console, console.options.update_width(10_000), table)
            assert table_width(table) == measured.maximum
            assert width == 80 or table_width(table) <= width


def test_rendering_is_deterministic(plan, plain):
    assert plain(plan_table(plan)) == plain(plan_table(plan))
