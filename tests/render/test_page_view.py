"""The plan page: self-contained, every step and reason in it, later schemas' data drawn.

Its rendering in a real browser is tested in tests/browser.
"""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser

from flexgraph import Graph, Insert, Move, Step, Strategy, make_plan
from flexgraph.core.checks import Precedes
from flexgraph.render import plan_to_dict
from flexgraph.render._align import Row, aligned_rows
from flexgraph.render.html import compare_page, plan_page


class _Text(HTMLParser):
    """The page's text and the URLs its tags name."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "data") and value:
                self.urls.append(value)

    def handle_data(self, data):
        self.text.append(data)


def page_text(page: str) -> tuple[str, list[str]]:
    parser = _Text()
    parser.feed(page)
    return " ".join(" ".join(parser.text).split()), parser.urls


def test_the_page_names_every_step_and_every_rewrite(plan):
    text, _ = page_text(plan_page(plan))
    for name in {*plan.order, *plan.base_order}:
        assert name in text, name
    for applied in plan.rewrites:
        assert applied.description in text, applied.description


def test_the_page_loads_nothing(plan):
    page = plan_page(plan)
    _, urls = page_text(page)
    assert urls == []
    fetched = re.findall(r"https?://[^\s\"'<>)]+", page)
    assert set(fetched) <= {"http://www.w3.org/2000/svg"}  # the SVG namespace, never fetched
    assert "@import" not in page and not re.search(r"url\((?!#)", page)  # #: in the page


def test_the_checks_give_the_reasons_of_the_orders_at_the_step_the_strategy_placed():
    graph = Graph.of([Step("build", "m:build", provides="model"),
                      Step("optim", "m:optim", requires="model", provides="opt")])
    strategy = Strategy("s", [Insert(Step("shard", "m:shard", updates="model",
                                          doc="shard the model"), after="build")],
                        checks=[Precedes("shard", "optim", "an optimizer before sharding holds "
                                                           "the full parameters")])
    text, _ = page_text(plan_page(make_plan(graph, strategy), checks=strategy.checks))
    assert "s #1 inserted: insert shard after build" in text
    assert "why: runs before optim: an optimizer before sharding holds the full parameters" in text
    assert "does: shard the model" in text


def test_a_plan_and_its_json_draw_the_same_page(plan):
    assert plan_page(plan_to_dict(plan)) == plan_page(plan_to_dict(plan))
    text, _ = page_text(plan_page(plan_to_dict(plan)))
    assert "demo #4 fused" in text and "= build_param_schedulers" in text


def _plan2(plan) -> dict:
    """The demo plan's JSON as the next schema gives it: model facts, needs, reasons,
    a skipped conditional and a user's step."""
    data = copy.deepcopy(plan_to_dict(plan))
    data["schema"] = "flexgraph.plan/2"
    facts = {"build_model": (["whole", "unwrapped"], []), "init_weights": (["initialised"], []),
             "shard_model": (["sharded", "on_device"], ["whole", "unwrapped"])}
    for step in data["steps"]:
        gives, ends = facts.get(step["name"], ([], []))
        step["gives"], step["ends"] = gives, ends
    freeze = next(s for s in data["steps"] if s["name"] == "freeze_backbone")
    freeze["origin"], freeze["needs"] = "user", ["initialised"]
    data["rewrites"][1]["why"] = "the sharded load reads this rank's rows"
    data["rewrites"].append({"index": 6, "strategy": "demo", "kind": "insert",
                             "description": "insert materialize after shard_model",
                             "touched": {}, "consumed": {},
                             "skipped": "init_weights is planned"})
    return data


def test_a_later_schemas_facts_needs_reasons_and_skips_are_drawn(plan):
    text, _ = page_text(plan_page(_plan2(plan)))
    assert "model +whole +unwrapped" in text
    assert "model +sharded +on_device -whole -unwrapped" in text
    assert "needs initialised" in text
    assert "why: the sharded load reads this rank's rows" in text
    assert "demo #7 skipped: insert materialize after shard_model (skipped: init_weights is " \
           "planned)" in text
    assert "u freeze_backbone" in text


def test_without_those_fields_nothing_of_them_is_drawn(plan):
    text, _ = page_text(plan_page(plan))
    assert "model +" not in text and "needs " not in text and " skipped" not in text


def test_a_conditional_rewrite_that_changed_nothing_is_shown_skipped_with_its_condition():
    graph = Graph.of([Step("a", "m:a", provides="x"), Step("b", "m:b", requires="x")])
    from flexgraph import IfPresent

    strategy = Strategy("s", [IfPresent("c", Move("b", after="a"))])
    text, _ = page_text(plan_page(make_plan(graph, strategy)))
    assert "s #1 skipped: move b after a, when c is planned (skipped: c is not planned)" in text


def test_steps_keep_their_row_and_a_moved_step_gets_one_at_each_place():
    rows = aligned_rows(["a", "b", "c", "d"], ["a", "c", "b", "n", "d"], {}, moved={"b"})
    assert rows == [Row("a", "a"), Row("b", None), Row("c", "c"), Row(None, "b"),
                    Row(None, "n"), Row("d", "d")]
    fused = aligned_rows(["a", "b", "c"], ["a", "bc"], {"b": "bc", "c": "bc"})
    assert fused == [Row("a", "a"), Row("b", "bc"), Row("c", None)]


def _report(plan, steps):
    return {"world_size": 2, "candidates": [{
        "candidate": "demo", "peak_bytes": 5000, "phase": "backward", "fits": True,
        "setup": {"rank0_bytes": 3000, "other_bytes": 1000},
        "steps": {"trains_on": "host", "allocations": steps}}]}


def test_the_estimate_shows_what_each_rank_holds_at_each_step_and_marks_the_peak(plan):
    steps = [{"step": "build_model", "bytes": 2000, "what": "the whole model", "ranks": "rank0",
              "memory": "host", "transient": False},
             {"step": "shard_model", "bytes": 1000, "what": "shards", "ranks": "all",
              "memory": "host", "transient": False},
             {"step": "shard_model", "bytes": -2000, "what": "the whole model",
              "ranks": "rank0", "memory": "host", "transient": False}]
    order = list(plan.order)
    from flexgraph.render._page_memory import held_by_step

    held, _ = held_by_step(order, _report(plan, steps)["candidates"][0])
    assert held["init_weights"][("rank0", "host")] == 2000
    assert held["init_weights"][("others", "host")] == 0
    assert held["shard_model"][("rank0", "host")] == 3000  # freed after the step
    assert held["load_checkpoint"][("rank0", "host")] == 1000
    assert held["train"][("rank0", "host")] == held["train"][("others", "host")] == 5000
    text, _ = page_text(plan_page(plan, estimate=_report(plan, steps)))
    assert "host, rank 0" in text and "host, each other rank" in text
    assert "rank 0 +2.0 KB host: the whole model" in text
    assert "5.0 KB peak" in text


def test_measured_figures_of_every_rank_are_shown(plan):
    measured = [[{"step": name, "seconds": 0.5 + rank, "rss_bytes": 100_000_000,
                  "peak_rss_bytes": 100_000_000 + 1_000_000 * i + rank * 7_000_000,
                  "device_peak_bytes": None} for i, name in enumerate(plan.order)]
                for rank in range(2)]
    text, _ = page_text(plan_page(plan, measured=measured))
    assert "rank 0: seconds" in text and "rank 1: seconds" in text
    assert "0.500" in text and "1.500" in text
    assert "107.0 MB" in text and "(+7.0 MB)" in text  # rank 1 at its first step


def test_a_comparison_shows_each_candidate_with_its_verdict(plan, base_plan):
    report = _report(plan, [])
    report["candidates"].append({**report["candidates"][0], "candidate": "base",
                                 "fits": False})
    text, _ = page_text(compare_page(report, {"demo": (plan, ()), "base": (base_plan, ())}))
    assert "demo: fits" in text and "base: does NOT fit" in text
