"""The plan pages, opened in headless Chromium as a user opens them.

Each page of the quickstart under every built-in strategy holds every step,
rewrite and reason in its rendered DOM, loads nothing from the network, draws
something (its screenshot is not blank) and stays small. The estimate page
holds every figure of the estimate per step, answering "how much does rank 0
hold at init_weights?"; the page a 2-process FSDP run leaves in its folder
holds both ranks' measurements.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from flexgraph.cli.plan_cmd import load_spec_and_plan
from flexgraph.render._page_memory import columns, held_by_step
from flexgraph.render.estimate import size_text
from tests.browser.chromium import (
    OFFLINE,
    DomText,
    dump_dom,
    needs_chromium,
    page_requests,
    screenshot_pixels,
)

pytestmark = [pytest.mark.slow, needs_chromium]

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = "examples/quickstart.py"
STRATEGIES = ("single", "ddp", "fsdp", "deepspeed")
MAX_BYTES = 300_000


def flexgraph(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "flexgraph", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pages")
    for strategy in STRATEGIES:
        flexgraph("plan", QUICKSTART, "--strategy", strategy, "--format", "html",
                  "-o", str(folder / f"{strategy}.html"))
    return {s: folder / f"{s}.html" for s in STRATEGIES}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_step_rewrite_and_reason_is_in_the_rendered_page(pages, tmp_path, strategy):
    spec, plan = load_spec_and_plan(QUICKSTART, strategy, [])
    dom = DomText(dump_dom(pages[strategy], tmp_path / "profile"))
    for name in {*plan.order, *plan.base_order}:
        assert name in dom.text, name
    for applied in plan.rewrites:
        assert " ".join(applied.description.split()) in dom.text, applied.description
        if applied.applied:
            assert " ".join(applied.why.split()) in dom.text, applied.why
        else:
            assert f"(skipped: {applied.skipped})" in dom.text
    for name in plan.order:  # the model after each step
        if plan.states.get(name):
            assert dom.rows[f"model-{name}"][2] == ", ".join(plan.states[name]), name
    for check in spec.resolve_strategy(strategy).checks:
        if check.first in plan.order and check.then in plan.order:
            assert " ".join(check.why.split()) in dom.text, check.why
    assert pages[strategy].stat().st_size <= MAX_BYTES


def test_the_fsdp_page_says_what_fsdp_changed_and_why(pages, tmp_path):
    dom = DomText(dump_dom(pages["fsdp"], tmp_path / "profile"))
    assert "fsdp #3 inserted: insert fully_shard after build_model" in dom.text
    assert ("why: runs before build_optim_wrapper: an optimizer built before sharding holds "
            "the full parameters") in dom.text
    assert "fsdp #1 replaced: replace setup_env with" in dom.text
    assert ("fsdp #7 move : move init_weights after materialize, when init_weights is planned "
            "(applied: init_weights is planned) (why: init_weights writes each rank's rows "
            "into its shards") in dom.text
    assert ("fsdp #4 skipped : move compile before fully_shard, when compile is planned "
            "(skipped: compile is not planned)") in dom.text
    assert dom.rows["model-fully_shard"][2:4] == ["sharded", "+sharded -unwrapped"]
    assert dom.rows["model-init_weights"][2:4] == ["initialised, on_device, sharded",
                                                   "+initialised"]


def test_a_step_of_the_users_is_marked_and_drawn_where_its_needs_placed_it(tmp_path):
    (tmp_path / "mysteps.py").write_text("def count_and_freeze(model):\n    pass\n")
    (tmp_path / "cfg.py").write_text(
        f"_base_ = [{str(ROOT / QUICKSTART)!r}]\n"
        "custom_steps = [dict(name='count_and_freeze', fn='mysteps:count_and_freeze', "
        "updates='model', after='load_checkpoint', before='wrap_model', needs=['loaded'])]\n")
    page = tmp_path / "deepspeed.html"
    flexgraph("plan", "cfg.py", "--strategy", "deepspeed", "--format", "html", "-o", str(page),
              cwd=tmp_path)
    dom = DomText(dump_dom(page, tmp_path / "profile"))
    mine = dom.rows["model-count_and_freeze"]
    assert mine[1:] == ["count_and_freeze (yours)",
                        "in_engine, initialised, loaded, on_device, whole", "", "loaded"]
    after = dom.rows["model-load_checkpoint"][0]
    assert int(mine[0]) > int(after)  # after the load, which the engine moved
    assert f"{mine[0]} > count_and_freeze (yours)" in dom.text
    assert ("placed: after load_checkpoint, where the model has loaded (its anchors "
            "contradict:") in dom.text
    assert "the config's own step" in dom.text
    assert "placed by their needs, not at their anchors: count_and_freeze" in dom.text


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_the_page_loads_nothing_and_renders_whole_offline(pages, tmp_path, strategy):
    assert page_requests(pages[strategy], tmp_path / "profile") == set()
    offline = DomText(dump_dom(pages[strategy], tmp_path / "offline", *OFFLINE))
    online = DomText(dump_dom(pages[strategy], tmp_path / "online"))
    assert offline.text == online.text


def test_the_request_log_sees_what_a_page_fetches(tmp_path):
    """The check above can fail: a page that names an image on the web is caught."""
    page = tmp_path / "fetches.html"
    page.write_text('<html><body><img src="https://example.com/a.png"><p>x</p></body></html>')
    assert page_requests(page, tmp_path / "profile") == {"https://example.com/a.png"}


def test_the_screenshot_is_not_blank(pages, tmp_path):
    rows = screenshot_pixels(pages["deepspeed"], tmp_path / "profile")
    values = [v for row in rows[::8] for v in row[::37]]
    assert statistics.pstdev(values) > 20
    assert len({row for row in rows}) > 100  # many distinct rows: text and boxes drawn


def test_the_estimate_page_holds_every_figure_per_step_and_rank(tmp_path):
    args = ("plan", QUICKSTART, "--strategy", "fsdp", "--estimate", "--world-size", "2")
    report = json.loads(flexgraph(*args, "--format", "json").stdout)
    page = tmp_path / "estimate.html"
    flexgraph(*args, "--format", "html", "-o", str(page))
    dom = DomText(dump_dom(page, tmp_path / "profile"))
    _, plan = load_spec_and_plan(QUICKSTART, "fsdp", [])
    held, said = held_by_step(plan.order, report["candidates"][0])
    shown = columns(held, 2)  # rank 0 apart from the others only where they differ
    for name in plan.order:
        cells = dom.rows[f"memory-{name}"]
        assert cells[1] == name
        for cell, (_, key) in zip(cells[2:], shown, strict=False):
            assert cell.startswith(size_text(held[name][key])), (name, cells)
        for line in said.get(name, []):
            assert line in cells[-1]
    # how much does rank 0 hold at init_weights? as the others: its shards, one parameter in
    # flight (two fp32 copies of it), never the whole model besides
    at_init = held["init_weights"]["rank0", "host"]
    in_flight = 2 * 4 * report["parameters"]["largest_parameter"]
    assert at_init == held["init_weights"]["others", "host"]
    assert in_flight < at_init < report["parameters"]["bytes"] + in_flight
    assert dom.rows["memory-init_weights"][2] == size_text(at_init)
    assert "peak" in dom.rows["memory-train"][2]


def test_the_compare_page_puts_the_candidates_side_by_side(tmp_path):
    page = tmp_path / "compare.html"
    flexgraph("plan", QUICKSTART, "--compare", "ddp,fsdp,deepspeed:zero3", "--world-size", "2",
              "--format", "html", "-o", str(page))
    dom = DomText(dump_dom(page, tmp_path / "profile"))
    for label in ("ddp", "fsdp", "deepspeed:zero3"):
        assert f"{label}: fits" in dom.text
        assert dom.rows[f"memory-{label}-train"][1] == "train"


def test_the_page_of_a_2_process_fsdp_run_holds_both_ranks_figures(tmp_path):
    flexgraph("run", QUICKSTART, "--strategy", "fsdp", "--nproc-per-node", "2",
              "--work-dir", str(tmp_path / "work"), "--cfg-options", "train_cfg.max_epochs=1")
    (run,) = [p for p in (tmp_path / "work").iterdir() if (p / "plan.json").exists()]
    tables = (run / "timings.txt").read_text().split("step timings, rank ")[1:]
    assert [t.split()[0] for t in tables] == ["0", "1"]
    dom = DomText(dump_dom(run / "plan.html", tmp_path / "profile"))
    plan = json.loads((run / "plan.json").read_text())
    for rank, table in enumerate(tables):
        rows = {line.split()[0]: line.split() for line in table.splitlines()[3:] if line.strip()}
        for step in (s["name"] for s in plan["steps"]):
            seconds, peak_mib = rows[step][-3], float(rows[step][-1])
            cells = dom.rows[f"memory-{step}"]
            assert cells[2 + 2 * rank] == seconds, (rank, step, cells)
            shown, unit = cells[3 + 2 * rank].split()[:2]
            assert unit == "MB"  # decimal, the table's MiB within their rounding
            assert abs(float(shown) * 1e6 - peak_mib * 2**20) < 0.06 * 2**20 + 0.05e6
