"""The run's context: what a run knows beyond its config, handed to the steps as an input.

``flexgraph run`` builds one :class:`RunContext` (the plan, the work_dir's
record, the rank, the launch's facts) and the standard graph takes it as its
``run_context`` input, the way it takes the settings; the steps that need any
of it take it as an argument. Without the command line, the context is this
process alone, and what it lacks (a plan, a record) is missing only because
nobody gave it.
"""

from __future__ import annotations

import json
import logging

import attrs
import pytest
from mmengine.logging import MessageHub

from flexgraph import Executor, get_strategy, make_plan
from flexgraph.render import plan_json
from flexgraph.training import loop
from flexgraph.training.checkpoint import read_manifest
from flexgraph.training.config import read_settings
from flexgraph.training.graph import standard_graph, standard_inputs
from flexgraph.training.output import (
    LaunchFacts,
    RunContext,
    open_progress,
    open_run_record,
    read_progress,
)
from tests.training.training_helpers import run_steps, toy_cfg


def _one_epoch(work_dir):
    """Ten iterations, saved at the epoch's end, logged every five."""
    return toy_cfg(work_dir, train_cfg=dict(by_epoch=True, max_epochs=1),
                   default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1),
                                      logger=dict(type="LoggerHook", interval=5)))


def _portable_manifest(work_dir, context_of) -> tuple[dict, dict]:
    """Train through the Python API under ``single`` writing portable checkpoints, with the
    context ``context_of(plan_dict)`` (``None``: the default); return the plan's dict and
    the manifest of the checkpoint it saved."""
    cfg = _one_epoch(work_dir)
    plan = make_plan(standard_graph(),
                     get_strategy("single", device="cpu", checkpoint_format="portable"))
    plan_dict = json.loads(plan_json(plan))
    Executor().run(plan, standard_inputs(cfg, context_of(plan_dict)))
    [saved] = sorted(work_dir.glob("*.ckpt"))
    return plan_dict, read_manifest(saved)


def test_a_portable_checkpoint_records_the_plan_its_context_carries(tmp_path):
    plan, manifest = _portable_manifest(tmp_path / "work", lambda plan: RunContext(plan=plan))
    assert manifest["plan"] == plan
    assert manifest["strategy"] == "single"


def test_without_a_plan_in_its_context_a_portable_checkpoint_records_none(tmp_path):
    _, manifest = _portable_manifest(tmp_path / "work", lambda plan: None)
    assert manifest["plan"] is None and manifest["strategy"] is None


def test_without_the_command_line_the_context_is_this_process_alone(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    inputs = standard_inputs(toy_cfg("work", log_level="WARNING"))
    context = inputs["run_context"]
    assert (context.rank, context.world_size, context.plan, context.record) == (0, 1, None, None)
    assert context.launch == LaunchFacts()
    # its log is this process's console, at the config's level, in the work_dir
    assert context.log_dir == inputs["settings"].work_dir
    assert context.logger.handlers[0].level == logging.WARNING
    assert context.message_hub is MessageHub.get_current_instance()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    placed = standard_inputs(toy_cfg("work"))["run_context"]
    assert (placed.rank, placed.world_size) == (3, 4), "as the launcher placed the process"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        placed.rank = 0


def test_the_hooks_log_through_the_record_their_context_holds(tmp_path):
    cfg = _one_epoch(tmp_path / "work")
    settings = read_settings(cfg)
    record = open_run_record(cfg, settings, "{}")
    try:
        context = RunContext(record=record)
        assert (context.logger, context.timestamp, context.log_dir) == \
            (record.logger, record.timestamp, str(record.run_dir)), "the record's log"
        runner = loop.build_hooks(cfg, settings, context).runner
        assert runner.logger is record.logger and runner.log_dir == str(record.run_dir)
        assert runner.message_hub is context.message_hub and runner.timestamp == record.timestamp
        alone = loop.build_hooks(cfg, settings, RunContext()).runner
        assert alone.logger is not record.logger, "a context without a record: its own logger"
        assert alone.log_dir == settings.work_dir
    finally:
        record.close()


def test_a_context_makes_its_log_once_and_each_context_has_its_own_message_hub():
    context = RunContext()
    assert context.logger is context.logger and context.message_hub is context.message_hub
    assert RunContext().message_hub is not context.message_hub


def test_the_loop_writes_its_iterations_into_the_progress_record_of_its_context(tmp_path):
    folder = tmp_path / "progress"
    folder.mkdir()
    progress = open_progress(folder, rank=0)
    context = RunContext(launch=LaunchFacts(progress=progress))
    run_steps(_one_epoch(tmp_path / "work"), run_context=context, setup_env={"device": "cpu"})
    assert read_progress(folder, 0) == {"step": None, "iter": 10, "every": 5}
    assert open_progress(None, rank=0) is None, "no folder: no launcher asked for a record"
