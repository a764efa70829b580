"""Bad input a user meets in the first hour: one or two lines naming it, exit 2, nothing written.

Each row is one mistake: config text added to the quickstart (or command-line
arguments), and the words the message must hold to name the culprit and the
fix. ``flexgraph run`` must exit 2 with at most two lines on stderr (no
traceback), before any step runs: no work_dir, no checkpoint. To cover one
more mistake, add one row.

Runs go through the CLI's ``main(argv)`` in this process (every check fires
before the model is built, so a row costs a config load and a plan); the
real-process paths are tested in test_run_cli.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NamedTuple

import pytest

from flexgraph.cli.main import main
from tests.cli.cli_helpers import QUICKSTART, ROOT


class Bad(NamedTuple):
    config: str  # appended to a config whose _base_ is the quickstart
    args: str  # more `flexgraph run` arguments ({config}: the config file's path)
    words: tuple[str, ...]  # the message names the culprit and the fix with these


def cfg(text: str, *words: str) -> Bad:
    return Bad(text, "", words)


def cli(args: str, *words: str) -> Bad:
    return Bad("", args, words)


ROWS = [
    # custom_hooks
    cfg("custom_hooks = ['MyHook']", "custom_hooks[0]: 'MyHook' is a string",
        "write dict(type='MyHook')"),
    cli("--cfg-options custom_hooks=[dict(type=MyHook)]", "custom_hooks[0]",
        "write dict(type='MyHook')"),
    cfg("custom_hooks = dict(type='EmptyCacheHook')", "custom_hooks must be a list",
        "custom_hooks=[dict(type=...)]"),
    cfg("custom_hooks = [dict(priority='LOW')]", "custom_hooks[0]", "has no 'type'"),
    cfg("custom_hooks = [42]", "custom_hooks[0]", "not a component"),
    cfg("custom_hooks = [dict(type='EmptyCacheHook', after_iterr=True)]",
        "custom_hooks[0].after_iterr", "did you mean 'after_iter'"),
    # default_hooks
    cfg("default_hooks = dict(logger='LoggerHook')", "default_hooks.logger",
        "write dict(type='LoggerHook')"),
    cfg("default_hooks = ['CheckpointHook']", "default_hooks must be a dict"),
    cfg("default_hooks = dict(checkpoint=dict(interval='abc'))",
        "default_hooks.checkpoint.interval must be an integer"),
    cfg("default_hooks = dict(checkpoint=dict(intervall=1))",
        "default_hooks.checkpoint.intervall", "did you mean 'interval'"),
    cfg("default_hooks = dict(checkpoint=dict(max_keep_ckpts='3'))",
        "default_hooks.checkpoint.max_keep_ckpts", "integer >= -1"),
    cfg("default_hooks = dict(checkpoint=dict(by_epoch='yes'))",
        "default_hooks.checkpoint.by_epoch must be True or False"),
    cfg("default_hooks = dict(checkpoint=dict(save_begin=-1))",
        "default_hooks.checkpoint.save_begin", ">= 0"),
    cfg("default_hooks = dict(checkpoint=dict(save_best='acc', rule='bigger'))",
        "default_hooks.checkpoint.rule", "'greater', 'less'"),
    cfg("default_hooks = dict(logger=dict(interval=0))",
        "default_hooks.logger.interval", ">= 1"),
    # optim_wrapper
    cfg("optim_wrapper = dict(type='ApexOptimWrapper', opt_level='O1')",
        "ApexOptimWrapper", "removed upstream", "type='AmpOptimWrapper'"),
    cfg("optim_wrapper = 'AdamW'", "optim_wrapper: 'AdamW' is a string"),
    cfg("optim_wrapper = dict(_delete_=True, optimizer='AdamW')",
        "optim_wrapper.optimizer: 'AdamW' is a string", "dict(type='AdamW', lr=...)"),
    cfg("optim_wrapper = dict(_delete_=True, clip_grad=None)",
        "optim_wrapper has no 'optimizer'"),
    cfg("optim_wrapper = dict(optimizer=dict(_delete_=True, lr=0.1))",
        "optim_wrapper.optimizer", "has no 'type'"),
    cfg("optim_wrapper = dict(optimizer=dict(lrr=1e-3))",
        "optim_wrapper.optimizer.lrr", "AdamW", "did you mean 'lr'"),
    cfg("optim_wrapper = dict(optimizer=dict(lr='1e-3'))",
        "optim_wrapper.optimizer.lr must be a number"),
    cfg("optim_wrapper = dict(optimizerr=dict(type='SGD', lr=0.1))",
        "optim_wrapper.optimizerr", "did you mean 'optimizer'"),
    cfg("optim_wrapper = dict(accumulative_counts=0)",
        "optim_wrapper.accumulative_counts", ">= 1"),
    cfg("optim_wrapper = dict(clip_grad=1.0)", "optim_wrapper.clip_grad",
        "clip_grad=dict(max_norm=1.0)"),
    cfg("optim_wrapper = dict(type='AmpOptimWrapper', dtype='fp16')",
        "optim_wrapper.dtype='fp16'", "'float16', 'bfloat16'"),
    # param_scheduler
    cfg("param_scheduler = 'CosineAnnealingLR'", "param_scheduler: 'CosineAnnealingLR' is a "
        "string", "dict(type='CosineAnnealingLR')"),
    cfg("param_scheduler = [dict(by_epoch=True)]", "param_scheduler[0]", "has no 'type'"),
    cfg("param_scheduler = [dict(type='LinearLR', begin=5, end=2)]",
        "param_scheduler[0]: end=2 must be after begin=5"),
    cfg("param_scheduler = [dict(type='LinearLR', by_epoch='true')]",
        "param_scheduler[0].by_epoch must be True or False"),
    cfg("param_scheduler = [dict(type='LinearLR', begin=-1)]", "param_scheduler[0].begin",
        ">= 0"),
    # train_cfg
    cfg("train_cfg = dict(val_intervall=1)", "train_cfg.val_intervall",
        "did you mean 'val_interval'"),
    cfg("train_cfg = dict(max_epochs='2')", "train_cfg.max_epochs must be an integer"),
    cfg("train_cfg = dict(val_interval=0)", "train_cfg.val_interval", ">= 1"),
    cfg("train_cfg = dict(type='FancyLoop')", "train_cfg.type='FancyLoop'",
        "'IterBasedTrainLoop'"),
    cfg("train_cfg = dict(_delete_=True, by_epoch=True)", "train_cfg", "max_epochs >= 1"),
    cfg("train_cfg = 5", "train_cfg must be a dict"),
    # dataloaders
    cfg("train_dataloader = dict(batch_size=0)", "train_dataloader.batch_size", ">= 1"),
    cfg("train_dataloader = dict(batch_size='32')", "train_dataloader.batch_size",
        "got '32'"),
    cfg("val_dataloader = dict(num_workers=-1)", "val_dataloader.num_workers", ">= 0"),
    cfg("train_dataloader = dict(pin_memory='yes')", "train_dataloader.pin_memory",
        "True or False"),
    cfg("train_dataloader = dict(batchsize=32)", "train_dataloader.batchsize",
        "did you mean 'batch_size'"),
    cfg("train_dataloader = dict(dataset='DigitsDataset')", "train_dataloader.dataset",
        "write dict(type='DigitsDataset')"),
    cfg("train_dataloader = dict(sampler='DefaultSampler')", "train_dataloader.sampler",
        "dict(type='DefaultSampler', shuffle=True)"),
    cfg("train_dataloader = dict(drop_last='no')", "train_dataloader.drop_last",
        "True or False"),
    cfg("test_dataloader = dict(batch_size=4)", "test_dataloader has no 'dataset'"),
    # strategy (checked when the config is planned)
    cfg("strategy = 'deepspeedd'", "unknown strategy 'deepspeedd'",
        "did you mean 'deepspeed'"),
    cfg("strategy = dict(type='DDPStrategy', foo=1)", "'DDPStrategy'", "'foo'"),
    cfg("strategy = dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=4))",
        "zero_optimization.stage=4", "must be 0, 1, 2 or 3"),
    cfg("strategy = dict(type='DeepSpeedStrategy', fp16=dict(enabled=True), "
        "bf16=dict(enabled=True))", "fp16 and bf16", "choose one precision"),
    cfg("strategy = dict(type='FSDPStrategy', activation_checkpointing='yes')",
        "activation_checkpointing='yes'", "True or dict(check_fn=...)"),
    # the rest of the run's keys
    cfg("param_schedular = [dict(type='LinearLR')]", "'param_schedular'",
        "did you mean 'param_scheduler'"),
    cfg("randomness = dict(seed='x')", "randomness.seed", "got 'x'"),
    cfg("randomness = dict(deterministic='yes')", "randomness.deterministic",
        "True or False"),
    cfg("resume = 'sometimes'", "resume 'sometimes' does not exist", "--resume auto"),
    cfg("load_from = '/no/such/weights.pth'", "load_from '/no/such/weights.pth' does not "
        "exist"),
    cfg("preemption = dict(signal='SIGFOO')", "preemption.signal='SIGFOO'", "SIGUSR1"),
    cfg("preemption = dict(check_interval=0)", "preemption.check_interval", ">= 1"),
    # the command line's own arguments
    cli("--work-dir {config}", "work_dir", "is not a directory", "--work-dir"),
    cli("--work-dir {config}/run", "is not a directory (under the file", "--work-dir"),
    cli("--resume /no/such/iter_10.pth", "resume '/no/such/iter_10.pth' does not exist"),
    cli("--load-from /no/such/weights.pth", "load_from '/no/such/weights.pth' does not "
        "exist"),
    cli("--cfg-options train_cfg.max_epochs", "--cfg-options 'train_cfg.max_epochs'",
        "KEY=VALUE"),
    cli("--cfg-options 'custom_hooks=[dict(type=EMAHook,momentum=0.1)]'",
        "custom_hooks=[dict(type=EMAHook,momentum=0.1)]", "one key per item"),
    cli("--cfg-options 'custom_hooks=[dict(type=A),dict(type=B)'",
        "'custom_hooks=[dict(type=A),dict(type=B)'", "unbalanced brackets"),
    cli("--nproc-per-node 0", "--nproc-per-node", "must be 1 or more"),
    cli("--nproc-per-node two", "--nproc-per-node", "'two' is not a whole number"),
    cli("--nnodes 0", "--nnodes", "must be 1 or more"),
    cli("--nnodes 4:2", "--nnodes", "MIN <= MAX"),
    cli("--master-port 70000", "--master-port", "in 1..65535"),
    cli("--max-restarts -1", "--max-restarts", "0 or more"),
    cli("--strategy fdsp", "unknown strategy 'fdsp'", "did you mean 'fsdp'"),
    cli("--entry fit", "--entry", "invalid choice: 'fit'"),
    cli("--preempt-signal SIGFOO", "preemption.signal='SIGFOO'"),
]


def test_the_table_covers_at_least_forty_mistakes():
    assert len(ROWS) >= 40
    assert len({(row.config, row.args) for row in ROWS}) == len(ROWS), "each row is new"


@pytest.mark.parametrize("row", ROWS, ids=[row.config or row.args for row in ROWS])
def test_bad_input_is_one_or_two_lines_exit_2_and_writes_nothing(row, tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # the quickstart's custom_imports
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.py"
    config.write_text(f"_base_ = [{str(QUICKSTART)!r}]\n{row.config}\n")
    args = shlex.split(row.args.format(config=config))
    status = main(["run", str(config), "--work-dir", str(tmp_path / "work"), *args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert 1 <= len(lines) <= 2 and "Traceback" not in err, err
    for words in row.words:
        assert words in err, (words, err)
    assert not (tmp_path / "work").exists(), "refused before the run's record was opened"
    written = sorted(p.name for p in Path(tmp_path).rglob("*") if p.name != "cfg.py")
    assert written == [], "no checkpoint, no half-written work_dir"


def test_work_dir_on_a_pipeline_without_one_is_one_line(tmp_path, capsys):
    """A plain pipeline has no work_dir unless a step takes one: the flag is refused, not
    ignored."""
    status = main(["run", str(ROOT / "examples" / "textstats_pipeline.py"), "--work-dir",
                   str(tmp_path / "work")])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "--work-dir: no step of the pipeline" in err and "drop the flag" in err, err
    assert not (tmp_path / "work").exists()
