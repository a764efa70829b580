"""``flexgraph plan``, end to end: a YAML spec in, a plan out, exit codes as documented.

Most tests run ``python -m flexgraph`` in a subprocess (stdout is a pipe, as in
CI); the exit-code mapping for errors no spec can produce (a failed step, a
crash, Ctrl-C) is checked in-process through :func:`flexgraph.cli.main.main`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flexgraph import FlexgraphError, StepFailedError
from flexgraph.cli import main as cli_main
from flexgraph.cli import plan_cmd

SPEC = textwrap.dedent(
    """\
    # a training-shaped pipeline and a strategy that uses every kind of rewrite
    steps:
      - {name: setup_env, fn: "demo_steps:setup_env", requires: cfg, provides: env}
      - {name: build_model, fn: "demo_steps:build_model", requires: [cfg, env], provides: model}
      - {name: init_weights, fn: "demo_steps:init_weights", updates: model}
      - {name: load_checkpoint, fn: "demo_steps:load_checkpoint", requires: cfg, updates: model}
      - {name: wrap_model, fn: "demo_steps:wrap_model", updates: model}
      - name: build_optim_wrapper
        fn: "demo_steps:build_optim_wrapper"
        requires: [cfg, model]
        provides: optim_wrapper
      - name: build_param_schedulers
        fn: "demo_steps:build_param_schedulers"
        requires: [cfg, optim_wrapper]
        provides: param_schedulers
      - {name: resume, fn: "demo_steps:resume", requires: cfg, updates: optim_wrapper}
      - name: train
        fn: "demo_steps:train"
        requires: [model, optim_wrapper, param_schedulers]
    strategies:
      demo:
        - insert: {name: freeze_backbone, fn: "demo_steps:freeze_backbone", updates: model}
          after: init_weights
        - {move: load_checkpoint, after: wrap_model}
        - replace: wrap_model
          with: {name: shard_model, fn: "demo_steps:shard_model", updates: model}
        - {fuse: [build_optim_wrapper, build_param_schedulers], into: build_optim}
        - {configure: build_model, params: {device: meta}}
        - {remove: resume}
    strategy: demo
    inputs: {cfg: {lr: 0.1}}
    """
)


DEMO_FUNCTIONS = (
    "setup_env", "build_model", "init_weights", "load_checkpoint", "wrap_model",
    "build_optim_wrapper", "build_param_schedulers", "resume", "train", "freeze_backbone",
    "shard_model",
)
DEMO_STEPS = "import torch  # plan checks these names without importing this module\n\n" + "".join(
    f"\ndef {name}(**artifacts):\n    return None\n" for name in DEMO_FUNCTIONS
)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "demo.yaml"
    path.write_text(SPEC)
    (tmp_path / "demo_steps.py").write_text(DEMO_STEPS)
    return path


def flexgraph(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m flexgraph ARGS`` with stdout and stderr captured (pipes)."""
    return subprocess.run(
        [sys.executable, "-m", "flexgraph", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
        timeout=60,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# formats ---------------------------------------------------------------------


@pytest.mark.slow
def test_text_is_the_default(spec):
    result = flexgraph("plan", spec)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("plan: demo\n")
    row = next(line for line in result.stdout.splitlines() if " freeze_backbone " in line)
    assert "inserted by" in row
    assert "  demo #6: remove resume" in result.stdout
    assert result.stderr == ""


@pytest.mark.slow
def test_text_in_a_pipe_is_plain_whatever_the_environment_says(spec):
    result = flexgraph("plan", spec, FORCE_COLOR="1", COLUMNS="40", TERM="xterm-256color")
    assert "\x1b[" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 120
    assert all(line == line.rstrip() for line in result.stdout.splitlines())
    assert result.stdout == flexgraph("plan", spec).stdout


@pytest.mark.slow
def test_json(spec):
    result = flexgraph("plan", spec, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema"] == "flexgraph.plan/2"
    assert data["strategy"] == "demo"
    assert [s["name"] for s in data["steps"]] == [
        "setup_env", "build_model", "init_weights", "freeze_backbone", "shard_model",
        "load_checkpoint", "build_optim", "train",
    ]


@pytest.mark.slow
def test_dot(spec):
    result = flexgraph("plan", spec, "--format", "dot")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("digraph plan {\n") and result.stdout.endswith("}\n")
    assert '"build_optim" -> "train"' in result.stdout


@pytest.mark.slow
def test_mermaid(spec):
    result = flexgraph("plan", spec, "-f", "mermaid")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("flowchart TD\n")
    assert "classDef fused" in result.stdout


@pytest.mark.slow
def test_diff(spec):
    result = flexgraph("plan", spec, "--diff")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("plan diff: base graph -> demo\n")
    for marker in ("+ freeze_backbone", "~ load_checkpoint", "! shard_model", "& build_optim",
                   "* build_model", "- resume", "- wrap_model -> shard_model"):
        assert marker in out
    assert "rewrites applied by demo:" in out


@pytest.mark.slow
def test_explain(spec):
    result = flexgraph("plan", spec, "--explain", "load_checkpoint")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("load_checkpoint is step 6 of 8")
    assert "moved by demo #2" in result.stdout


@pytest.mark.slow
def test_strategy_flag_overrides_the_spec(spec):
    result = flexgraph("plan", spec, "--strategy", "none", "--format", "json")
    data = json.loads(result.stdout)
    assert data["strategy"] is None
    assert [s["name"] for s in data["steps"]] == data["base_order"]


@pytest.mark.slow
def test_cfg_options_reach_the_spec(spec):
    result = flexgraph("plan", spec, "--cfg-options", "cfg.lr=0.5", "--format", "json")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_output_is_byte_identical_across_runs(spec):
    for args in ([], ["--format", "json"], ["--format", "dot"], ["--diff"]):
        assert flexgraph("plan", spec, *args).stdout == flexgraph("plan", spec, *args).stdout


@pytest.mark.slow
def test_plan_never_imports_torch(spec):
    code = (
        "import sys; from flexgraph.cli.main import main; "
        f"rc = main(['plan', {str(spec)!r}, '--diff']); "
        "print(rc, 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.stdout.splitlines()[-1] == "0 False", result.stderr


# function references: checked without importing ----------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("good", "bad", "fragments"),
    [
        ("demo_steps:init_weights", "demo_steps:init_weigths",
         ("step 'init_weights'", "no attribute 'init_weigths'", "did you mean 'init_weights'")),
        ("demo_steps:train", "demo_step:train",
         ("step 'train'", "no module named 'demo_step'", "did you mean 'demo_steps'")),
        ("demo_steps:shard_model", "demo_steps.sub:shard_model",
         ("step 'shard_model'", "'demo_steps' is a module, not a package")),
    ],
    ids=["function", "module", "not-a-package"],
)
def test_a_wrong_function_reference_is_an_error(spec, good, bad, fragments):
    spec.write_text(SPEC.replace(f'"{good}"', f'"{bad}"'))
    assert_one_line_error(flexgraph("plan", spec), *fragments)


@pytest.mark.slow
def test_references_that_cannot_be_read_statically_are_listed_as_notes(spec):
    (spec.parent / "star_steps.py").write_text("from demo_steps import *\n")
    spec.write_text(SPEC.replace('"demo_steps:train"', '"star_steps:train"'))
    result = flexgraph("plan", spec)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("plan: demo\n")
    assert result.stderr.splitlines() == [
        f"note: step 'train': fn 'star_steps:train' not checked: {spec.parent / 'star_steps.py'} "
        "binds no 'train' by name, but it has 'from demo_steps import *'"
    ]


# bad input: exit 2, one line, no traceback ---------------------------------------


@pytest.mark.slow
def test_missing_file(tmp_path):
    assert_one_line_error(flexgraph("plan", tmp_path / "nope.yaml"), "nope.yaml", "does not exist")


@pytest.mark.slow
def test_broken_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [\n")
    assert_one_line_error(flexgraph("plan", bad), "bad.yaml", "YAML")


@pytest.mark.slow
def test_unknown_strategy(spec):
    assert_one_line_error(flexgraph("plan", spec, "-s", "dem"), "unknown strategy 'dem'")


@pytest.mark.slow
def test_unknown_step_to_explain_suggests_close_names(spec):
    result = flexgraph("plan", spec, "--explain", "load_chekpoint")
    assert_one_line_error(
        result, "no step named 'load_chekpoint'", "did you mean 'load_checkpoint'"
    )


@pytest.mark.slow
def test_a_step_the_strategy_took_out_is_explained(spec):
    result = flexgraph("plan", spec, "--explain", "resume")
    assert result.returncode == 0
    assert "removed by demo #6: remove resume" in result.stdout


@pytest.mark.slow
def test_diff_and_explain_print_text_only(spec):
    assert_one_line_error(flexgraph("plan", spec, "--diff", "-f", "json"), "--diff", "json")


@pytest.mark.slow
def test_bad_cfg_option(spec):
    assert_one_line_error(flexgraph("plan", spec, "--cfg-options", "lr"), "KEY=VALUE")


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [[], ["plan"], ["plan", "x.yaml", "--format", "svg"], ["plan", "x.yaml", "--diff",
                                                             "--explain", "a"], ["fly"]],
)
def test_usage_errors_exit_2(args):
    result = flexgraph(*args)
    assert result.returncode == 2
    assert "usage: flexgraph" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_debug_shows_the_chained_traceback(spec):
    result = flexgraph("--debug", "plan", spec, "-s", "dem")
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: unknown strategy 'dem'")


@pytest.mark.slow
def test_debug_is_accepted_after_the_command(spec):
    result = flexgraph("plan", spec, "--debug", "--explain", "nope")
    assert result.returncode == 2
    assert "Traceback" in result.stderr


@pytest.mark.slow
def test_help_and_version():
    assert flexgraph("--help").returncode == 0
    version = flexgraph("--version")
    assert version.returncode == 0 and version.stdout.startswith("flexgraph ")
    assert "--explain" in flexgraph("plan", "--help").stdout


# the exit-code contract, in-process -------------------------------------------------


def raising(exc: BaseException):
    def command(args):
        raise exc

    return command


def failed_step(cause: BaseException) -> StepFailedError:
    try:
        raise cause
    except BaseException as inner:
        try:
            raise StepFailedError(
                f"step 'train' (base) failed: {type(inner).__name__}: {inner}", step="train"
            ) from inner
        except StepFailedError as outer:
            return outer


@pytest.mark.parametrize(
    ("exc", "status", "first_line"),
    [
        (FlexgraphError("bad\ninput"), 2, "error: bad input"),
        (failed_step(FlexgraphError("no such file")), 2, "error: step 'train': no such file"),
        (failed_step(ValueError("boom")), 1, "error: step 'train' (base) failed: ValueError: boom"),
        (RuntimeError("crash"), 1, "error: RuntimeError: crash"),
        (KeyboardInterrupt(), 130, "error: interrupted"),
    ],
)
def test_exit_status_and_message(monkeypatch, capsys, exc, status, first_line):
    monkeypatch.setattr(plan_cmd, "plan_command", raising(exc))
    assert cli_main.main(["plan", "x.yaml"]) == status
    err = capsys.readouterr().err.splitlines()
    assert err[0] == first_line
    assert len(err) == (2 if status == 1 else 1)
    if status == 1:
        assert err[1] == cli_main.DEBUG_HINT


def test_debug_prints_the_cause_too(monkeypatch, capsys):
    monkeypatch.setattr(plan_cmd, "plan_command", raising(failed_step(ValueError("boom"))))
    assert cli_main.main(["--debug", "plan", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert "ValueError: boom" in err
    assert "The above exception was the direct cause" in err
    assert cli_main.DEBUG_HINT not in err


def test_plan_alone_never_imports_run_cmd(monkeypatch):
    monkeypatch.delitem(sys.modules, "flexgraph.cli.run_cmd", raising=False)
    cli_main.build_parser(["plan", "x.yaml"])
    assert "flexgraph.cli.run_cmd" not in sys.modules


def test_the_text_and_json_views_say_which_reader_reads_load_from(tmp_path, capsys):
    checkpoint = tmp_path / "iter_9.ckpt"
    checkpoint.mkdir()
    (checkpoint / "manifest.json").write_text("{}")
    config = tmp_path / "cfg.py"
    config.write_text(f"model = dict(type='AnyModel')\nload_from = {str(checkpoint)!r}\n")
    note = (f"load_from {str(checkpoint)!r} is read as a portable checkpoint directory "
            f"(torch.distributed.checkpoint + manifest.json)")
    assert cli_main.main(["plan", str(config), "--strategy", "ddp"]) == 0
    assert f"\nload_checkpoint: {note}\n" in capsys.readouterr().out
    assert cli_main.main(["plan", str(config), "--strategy", "ddp", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == {"load_checkpoint": note}


QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


@pytest.mark.parametrize(("strategy", "step", "origin"), [
    ("fsdp", "fully_shard", "  inserted by fsdp #3: insert fully_shard after build_model"),
    ("deepspeed", "load_checkpoint",
     "  moved by deepspeed #3: move load_checkpoint after deepspeed_initialize"),
])
def test_explain_gives_the_reason_a_strategy_touched_a_step(capsys, strategy, step, origin):
    """Every touched step of every built-in strategy: tests/strategies/test_step_needs.py."""
    assert cli_main.main(["plan", str(QUICKSTART), "--strategy", strategy,
                          "--explain", step]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(origin))
    assert lines[at + 1].startswith("    why: ") and len(lines[at + 1]) > 20, lines


def test_explain_says_where_a_users_step_was_placed_by_need_and_why(tmp_path, monkeypatch,
                                                                    capsys):
    (tmp_path / "mysteps.py").write_text("def count_and_freeze(model):\n    pass\n")
    config = tmp_path / "cfg.py"
    config.write_text(f"_base_ = [{str(QUICKSTART)!r}]\n"
                      "custom_steps = [dict(name='count_and_freeze', fn='mysteps:count_and_freeze',"
                      " updates='model', after='load_checkpoint', before='wrap_model', "
                      "needs=['loaded'])]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli_main.main(["plan", str(config), "--strategy", "deepspeed",
                          "--explain", "count_and_freeze"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:4] == [
        "  the user's step (custom_steps)",
        "  placed by need: after load_checkpoint, where the model has loaded (its anchors "
        "contradict: deepspeed_initialize runs before load_checkpoint under 'deepspeed' "
        "(deepspeed_initialize -> load_checkpoint) (deepspeed #3: move load_checkpoint after "
        "deepspeed_initialize: the engine owns the parameters and the optimizer's master copies "
        "of them; weights loaded before it are overwritten or never reach the optimizer))",
        "  needs of the model: loaded (declared)"]
