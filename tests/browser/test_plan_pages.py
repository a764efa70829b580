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
from flexgraph.render._page_memory import held_by_step
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
    for check in spec.resolve_strategy(strategy).checks:
        if check.first in plan.order and check.then in plan.order:
            assert " ".join(check.why.split()) in dom.text, check.why
    assert pages[strategy].stat().st_size <= MAX_BYTES


def test_the_fsdp_page_says_what_fsdp_changed_and_why(pages, tmp_path):
    dom = DomText(dump_dom(pages["fsdp"], tmp_path / "profile"))
    assert "fsdp #5 inserted: insert fully_shard after init_weights" in dom.text
    assert ("why: runs before build_optim_wrapper: an optimizer built before sharding holds "
            "the full parameters") in dom.text
    assert "fsdp #1 replaced: replace setup_env with" in dom.text


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
    for name in plan.order:
        cells = dom.rows[f"memory-{name}"]
        assert cells[1] == name
        rank0, others = (size_text(held[name][r, "host"]) for r in ("rank0", "others"))
        assert cells[2].startswith(rank0) and cells[3].startswith(others), (name, cells)
        for line in said.get(name, []):
            assert line in cells[-1]
    # how much does rank 0 hold at init_weights? the whole model, fp32
    whole = report["parameters"]["bytes"]
    assert dom.rows["memory-init_weights"][2] == size_text(whole)
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
