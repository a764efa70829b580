"""Planning, as ``flexgraph plan`` and ``flexgraph run`` share it: one plan per process, the
rewrites the run's files call for found first, and the digest a launcher hands its ranks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from flexgraph.cli import planning
from flexgraph.cli.options import parse_cfg_options
from flexgraph.cli.planning import (
    choose_strategy,
    derived_plan,
    load_config,
    make_run_plan,
    plan_digest,
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _spec(*options: str):
    return load_config(str(QUICKSTART), parse_cfg_options(list(options)))


def test_the_digest_covers_the_graph_the_strategy_and_the_targets():
    spec = _spec()
    digest = plan_digest(spec, choose_strategy(spec, "fsdp"))
    again = _spec()
    assert plan_digest(again, choose_strategy(again, "fsdp")) == digest, "a load of its own"
    assert plan_digest(spec, choose_strategy(spec, "ddp")) != digest
    assert plan_digest(spec, choose_strategy(spec, "fsdp"), ("val",)) != digest
    compiled = _spec("compile=True")  # a step more in the base graph
    assert plan_digest(compiled, choose_strategy(compiled, "fsdp")) != digest
    options = [plan_digest(s, choose_strategy(s, "deepspeed")) for s in (
        _spec("strategy.type=deepspeed", "strategy.zero_optimization.stage=2"),
        _spec("strategy.type=deepspeed", "strategy.zero_optimization.stage=3"))]
    assert options[0] != options[1], "the strategy's options are part of it"


def test_the_digest_is_the_same_in_every_process():
    """Sets are sorted and addresses left out: processes hash strings differently."""
    probe = ("from flexgraph.cli.planning import choose_strategy, load_config, plan_digest\n"
             f"spec = load_config({str(QUICKSTART)!r})\n"
             "print(plan_digest(spec, choose_strategy(spec, 'fsdp')))\n")
    digests = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              check=True, env={"PYTHONHASHSEED": seed, "PATH": ""},
                              cwd=ROOT).stdout.strip() for seed in ("1", "2")}
    spec = _spec()
    assert digests == {plan_digest(spec, choose_strategy(spec, "fsdp"))}


def test_a_run_derives_first_then_plans_once(tmp_path, monkeypatch):
    from flexgraph.core.plan import make_plan
    from flexgraph.training.components import build_model_from_cfg

    spec = _spec()
    weights = tmp_path / "whole.pth"
    torch.save({"state_dict": build_model_from_cfg(spec.cfg, env=None).state_dict()}, weights)
    derived = []

    def planned(*args, **kwargs):
        derived.append(kwargs.get("derived", ()))
        return make_plan(*args, **kwargs)

    monkeypatch.setattr(planning, "make_plan", planned)
    plan, said = derived_plan(spec, choose_strategy(spec, "fsdp"), str(weights))
    assert len(derived) == 1 and [r.name for r in derived[0]] == ["init_weights"], \
        "one plan, made with the prune its files call for"
    assert "init_weights" not in plan.order and list(said["pruned"]) == ["init_weights"]
    assert plan.rewrites[0].strategy == "derived"
    # what a launcher plans: the same strategy, nothing derived (it builds no model)
    assert "init_weights" in make_run_plan(spec, choose_strategy(spec, "fsdp")).order
    assert len(derived) == 2 and derived[1] == ()
