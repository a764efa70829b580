"""explain_step: why a step sits where it does, or why it is gone."""

from __future__ import annotations

import pytest

from flexgraph import UnknownStepError
from flexgraph.render import explain_step


def test_a_planned_step_gets_the_plans_explanation(plan):
    assert explain_step(plan, "load_checkpoint") == plan.explain("load_checkpoint")
    text = explain_step(plan, "load_checkpoint")
    assert text.startswith("load_checkpoint is step 6 of 8")
    assert "moved by demo #2: move load_checkpoint after wrap_model" in text


def test_a_removed_base_step_names_the_rewrite(plan):
    assert explain_step(plan, "resume").splitlines() == [
        "resume is not in the plan: the base graph has it, the strategy took it out",
        "  removed by demo #6: remove resume",
    ]


def test_a_fused_base_step_points_at_its_successor(plan):
    lines = explain_step(plan, "build_param_schedulers").splitlines()
    assert lines[1] == (
        "  fused by demo #4: fuse build_optim_wrapper, build_param_schedulers into build_optim"
    )
    assert "its work is done by build_optim" in lines[2]


def test_a_replaced_base_step_points_at_its_successor(plan):
    assert "its work is done by shard_model" in explain_step(plan, "wrap_model")


def test_an_unknown_step_suggests_close_names(plan):
    with pytest.raises(UnknownStepError, match=r"did you mean 'load_checkpoint'\?"):
        explain_step(plan, "load_chekpoint")
