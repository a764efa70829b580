"""Needs, facts and reasons as data: YAML, cfg.py ``custom_steps`` and Python say them alike."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flexgraph import PlacementError, Step
from flexgraph.spec import SpecTypeError, load_spec
from flexgraph.training.graph import standard_graph

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"

YAML = """\
steps:
  - {name: build_model, fn: "m:build", requires: cfg, provides: model, gives: [whole, unwrapped]}
  - {name: load_checkpoint, fn: "m:load", updates: model, gives: loaded}
  - {name: freeze, fn: "m:freeze", updates: model, after: build_model, needs: [loaded]}
  - {name: train, fn: "m:train", requires: model}
inputs: {cfg: {}}
strategies:
  meta:
    - {configure: build_model, params: {device: meta}, ends: [whole], why: "no storage yet"}
    - {move: freeze, before: train, why: "freeze last"}
"""


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_yaml_steps_take_needs_and_facts_and_rewrites_their_why(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "p.yaml", YAML))
    built = spec.graph.by_name["build_model"]
    assert (built.gives, spec.graph.by_name["freeze"].needs) == (("whole", "unwrapped"),
                                                                 ("loaded",))
    plan = spec.plan("meta")
    assert [r.why for r in plan.rewrites] == ["no storage yet", "freeze last"]
    assert plan.graph.by_name["build_model"].ends == ("whole",)
    assert plan.states["build_model"] == ("unwrapped",)


def test_a_yaml_fact_must_be_a_name(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", YAML.replace("gives: loaded", "gives: [1]"))
    with pytest.raises(SpecTypeError, match="field 'gives' must be a name or a list of names"):
        load_spec(path)


def cfg(tmp_path: Path, custom_steps: str) -> Path:
    """The quickstart with the user's steps, read without importing its modules (no torch)."""
    return write(tmp_path, "cfg.py", f"""\
        _base_ = [{str(QUICKSTART)!r}]
        custom_imports = dict(imports=[], allow_failed_imports=False)
        custom_steps = {custom_steps}
    """)


def test_custom_steps_are_the_users_and_take_needs(tmp_path: Path) -> None:
    spec = load_spec(cfg(tmp_path, """[dict(name="count_and_freeze",
        fn="mysteps:count_and_freeze", updates="model", after="load_checkpoint",
        before="wrap_model", needs=["loaded"])]"""), default_graph=standard_graph)
    step = spec.graph.by_name["count_and_freeze"]
    assert (step.user, step.needs) == ("custom_steps", ("loaded",))
    plan = spec.plan({"type": "deepspeed", "zero_optimization": {"stage": 2}})
    assert plan.order.index("load_checkpoint") < plan.order.index("count_and_freeze")
    assert plan.origin("count_and_freeze").short == "placed by need"


def test_the_issues_example_is_refused_under_fsdp_with_the_way_out(tmp_path: Path) -> None:
    spec = load_spec(cfg(tmp_path, """[dict(name="count_and_freeze",
        fn="mysteps:count_and_freeze", updates="model", after="load_checkpoint",
        before="wrap_model", params=dict(freeze_prefix="net.0."))]"""),
                     default_graph=standard_graph)
    assert spec.plan("ddp").origin("count_and_freeze").action == "base"
    with pytest.raises(PlacementError) as info:
        spec.plan("fsdp")
    message = str(info.value)
    assert message.startswith(f"{spec.source}: strategy 'fsdp': custom_steps: step "
                              "'count_and_freeze' needs the model")
    assert "instead declare needs=['initialised', 'loaded'] (runs after load_checkpoint" in (
        message)


def test_a_custom_step_may_anchor_on_a_strategys_step(tmp_path: Path) -> None:
    spec = load_spec(cfg(tmp_path, """[dict(name="freeze_shards", fn="mysteps:freeze",
        updates="model", after="fully_shard")]"""), default_graph=standard_graph)
    assert "freeze_shards" not in spec.graph
    assert [s.name for s in spec.graph.pending] == ["freeze_shards"]
    plan = spec.plan("fsdp")
    assert plan.order.index("fully_shard") < plan.order.index("freeze_shards")
    with pytest.raises(LookupError, match="says after='fully_shard': no step named "
                                          "'fully_shard' under 'ddp'; instead anchor it on one of: "
                                          "build_model, init_weights, load_checkpoint, "
                                          "wrap_model"):
        spec.plan("ddp")


def test_python_steps_say_the_same() -> None:
    data = Step("count_and_freeze", "mysteps:count_and_freeze", updates="model",
                after="load_checkpoint", needs="loaded", user="custom_steps")
    assert data.needs == ("loaded",) and data == data.evolve(user="")
