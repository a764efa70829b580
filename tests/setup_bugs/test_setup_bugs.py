"""Eight published setup bugs: what plain code does, and what flexgraph says instead.

For each bug, :mod:`plain_scripts` does what the bug did with plain PyTorch or
DeepSpeed on two ranks over gloo (one launch for all eight), and the test reads
the wrong result it leaves: weights not loaded, a rank's weights garbage,
every rank holding the whole model, training that changes nothing. Then the
same step is put where the bug put it in a flexgraph setup, as a user's step
or a user's rewrite of a built-in strategy (:mod:`user_setups`), and flexgraph
refuses it by name: at plan time, or at the first broken contract of a real
two-rank ``flexgraph run``, in one line naming the step, the contract and the fix.
docs/guide/setup_bugs.rst lists them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexgraph import (
    CycleError,
    Move,
    PlacementError,
    PlanCheckError,
    Step,
    get_strategy,
    make_plan,
)
from flexgraph.core.errors import FlexgraphError
from flexgraph.training.graph import standard_graph

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "examples")])}


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    """What each plain script left, by bug, for rank 0 and rank 1 (one launch for all)."""
    out = tmp_path_factory.mktemp("plain") / "results.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", str(HERE / "plain_scripts.py"), str(out)], env=ENV, cwd=HERE,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(out.read_text())
    return {bug: [rank[bug] for rank in ranks] for bug in ranks[0]}


def refused_run(tmp_path: Path, bug: str, extra: str = "",
                strategy: str = "") -> str:
    """The one error line of ``flexgraph run`` on two ranks with the user's rewrite of ``bug``
    (or ``strategy``, a config's ``strategy`` value)."""
    config = tmp_path / "cfg.py"
    config.write_text(
        f"_base_ = [{str(QUICKSTART)!r}]\n"
        "custom_imports = dict(imports=['digits', 'user_setups'], allow_failed_imports=False)\n"
        f"strategy = {strategy or f'dict(type={bug!r})'}\n"
        "train_cfg = dict(by_epoch=False, max_iters=2, val_interval=100)\n"
        "val_dataloader = None\nval_cfg = None\nval_evaluator = None\nvisualizer = None\n"
        + extra)
    done = subprocess.run([sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir",
                           "work", "--nproc-per-node", "2"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "work").exists() or not list((tmp_path / "work").rglob("iter_*")), \
        "nothing was trained"
    return errors[0]


def refused_plan(graph, strategy, kind: type[FlexgraphError] = PlacementError) -> str:
    with pytest.raises(kind) as info:
        make_plan(graph, strategy)
    assert "\n" not in str(info.value)
    return str(info.value)


def user_step(name: str, fn: str, **anchors: str) -> Step:
    return Step(name, f"user_setups:{fn}", updates="model", user="custom_steps", **anchors)


def test_megatron_lm_6087_a_load_after_wrapping(plain):
    """Megatron-LM#6087: weights loaded after wrapping, and silently ignored."""
    assert all(not r["loaded"] and r["missing"] for r in plain["megatron_lm_6087"])
    load = user_step("load_into", "load_into", after="wrap_model")
    graph = standard_graph().extend([load])
    # under DDP the user's load lands where its model is the module, and the plan says so
    ddp = make_plan(graph, get_strategy("ddp"))
    assert ddp.order.index("load_into") < ddp.order.index("wrap_model")
    assert "placed by need" in ddp.explain("load_into")
    # under FSDP no point has the whole, unwrapped model it was anchored to: refused
    line = refused_plan(graph, get_strategy("fsdp"))
    for words in ("step 'load_into' needs the model", "unwrapped ends at fully_shard",
                  "instead declare needs="):
        assert words in line, line


def test_megatron_bridge_3397_a_load_past_the_optimizer_copies(plain, tmp_path):
    """Megatron-Bridge#3397: a load that reaches one copy of the weights, not the optimizer's."""
    assert all(r["loaded_before_step"] and not r["loaded_after_step"]
               for r in plain["megatron_bridge_3397"])
    checkpoint = tmp_path / "weights.pth"
    _save_digits_weights(checkpoint)
    line = refused_run(tmp_path, "bug_megatron_bridge_3397", f"load_from = {str(checkpoint)!r}\n")
    for words in ("step 'build_train_step' broke contract 'engine_holds_model' before it ran",
                  "master copy", "first optimizer step", "fix:"):
        assert words in line, line


def test_roblox_fai_rl_66_zero3_config_after_the_model(plain, tmp_path):
    """Roblox/FAI-RL#66: ZeRO-3's config made after the model: every rank holds all of it."""
    assert all(r["held_before_engine"] == r["total"] and r["trained"]
               for r in plain["roblox_fai_rl_66"])
    line = refused_run(tmp_path, "bug_roblox_fai_rl_66")
    for words in ("step 'build_model' broke contract 'partitioned'",
                  "whole on every rank", "outside deepspeed.zero.Init", "fix:"):
        assert words in line, line


def test_deepspeed_8084_zero_init_before_the_process_group(plain):
    """DeepSpeed#8084: zero.Init before the ranks' group: partitioned over a world of one."""
    assert all(r["held"] == r["total"] for r in plain["deepspeed_8084"])
    early = get_strategy("deepspeed", zero_optimization={"stage": 3}).then(
        Move("build_model", before="setup_env"))
    line = refused_plan(standard_graph(), early, CycleError)
    for words in ("move build_model before setup_env", "build_model requires env"):
        assert words in line, line


def test_accelerate_4021_ranks_disagree_on_dtypes_before_sharding(plain, tmp_path):
    """accelerate#4021: rank 0's snapshot taken before the fp32 upcast, broadcast to the others
    (gloo hands them garbage; NCCL hangs)."""
    source, other = plain["accelerate_4021"]
    assert source["rank_matches_source"] and not other["rank_matches_source"]
    line = refused_run(tmp_path, "bug_accelerate_4021")
    for words in ("step 'fully_shard' broke contract 'dtypes_uniform' before it ran",
                  "hold unit '<root>' in different dtypes", "bfloat16", "hang", "fix:"):
        assert words in line, line


def test_accelerate_3979_an_upcast_after_sharding(plain):
    """accelerate#3979: the fp32 upcast applied after fully_shard, a no-op in forward."""
    assert all(r["forward_dtype"] == "torch.bfloat16" for r in plain["accelerate_3979"])
    cast = user_step("upcast", "upcast", after="load_checkpoint", before="wrap_model")
    line = refused_plan(standard_graph().extend([cast]), get_strategy("fsdp"))
    for words in ("step 'upcast' needs the model", "whole ends at build_model",
                  "instead declare needs="):
        assert words in line, line


def test_ms_swift_9982_every_rank_loads_the_whole_model(plain, tmp_path):
    """ms-swift#9982: efficient loading asked for, not applied: every rank holds all of it."""
    assert all(r["held_before_sharding"] == r["total"] for r in plain["ms_swift_9982"])
    line = refused_run(tmp_path, "bug_ms_swift_9982")
    for words in ("step 'build_model' broke contract 'source_alone_whole'",
                  "rank 1 built the model whole", "fix:"):
        assert words in line, line


def test_accelerate_fsdp2_optimizer_built_before_sharding(plain):
    """Accelerate's FSDP2 benchmark notes: an optimizer made before fully_shard trains nothing."""
    assert all(not r["changed"] for r in plain["accelerate_fsdp2_optimizer_first"])
    early = get_strategy("fsdp").then(Move("build_optim_wrapper", before="fully_shard"))
    with pytest.raises(PlanCheckError, match="build_optim_wrapper must run after fully_shard: "
                                             "an optimizer built before sharding"):
        make_plan(standard_graph(), early)


def test_a_weight_the_files_left_unset_is_refused_after_the_load(tmp_path):
    """FSDP's contract for a model nothing initialised: what load_from lacks holds NaN."""
    checkpoint = tmp_path / "first_layer.pth"
    _save_digits_weights(checkpoint, keep="net.0.")
    line = refused_run(tmp_path, "", f"load_from = {str(checkpoint)!r}\n",
                       strategy="dict(type='FSDPStrategy', skip_init_weights=True)")
    for words in ("step 'load_checkpoint' broke contract 'every_parameter_set'",
                  "2 parameters were never initialised", "'net.3.bias'", "fix:"):
        assert words in line, line


def _save_digits_weights(path: Path, keep: str = "") -> None:
    code = ("import sys, torch, digits; torch.manual_seed(1); "
            "torch.save({'state_dict': {k: v for k, v in digits.DigitsMLP().state_dict().items()"
            f" if k.startswith({keep!r})}}}}, sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(path)], env=ENV, check=True, timeout=120)
