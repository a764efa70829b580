"""A forward that writes its own weights in place, under the strategies that would lose the write.

FSDP gathers each parameter into a copy for the forward and frees it after;
ZeRO-3 keeps each rank's partition apart from the gathered copy (and outside a
module's forward a parameter is an empty placeholder). A momentum copy moved in
place in ``forward`` (:data:`~tests.cli.cli_helpers.MOMENTUM`) would then never
move, and the run would train other weights than under DDP, exit 0. The
strategy's contract ``forward_writes_kept`` stops it in the first training
forward instead, one line, exit 2, before any optimizer step.
"""

from __future__ import annotations

import pytest

from tests.cli.cli_helpers import MOMENTUM, flexgraph_run, write_config

pytestmark = pytest.mark.slow

WAY_OUT = ("(a momentum encoder updated in place?); {gist}, so those weights never change; use "
           "DDPStrategy or DeepSpeed ZeRO-1/2, which keep the weights whole")
CASES = {
    # no wrap policy: the root unit gathers both layers for the forward
    "fsdp": ("strategy = dict(type='FSDPStrategy')", "fully_shard", "FSDP", WAY_OUT.format(
        gist="FSDP frees that write with the gathered copy")),
    "zero3": ("strategy = dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3))",
              "deepspeed_initialize", "ZeRO-3", WAY_OUT.format(
                  gist="ZeRO-3 keeps each rank's partition apart from the gathered copy and "
                       "loses that write")),
}


@pytest.mark.parametrize("through_data", [False, True], ids=["parameter", "data"])
@pytest.mark.parametrize("strategy", sorted(CASES))
def test_a_forward_that_writes_its_own_weights_is_stopped_at_the_first_iteration(
        tmp_path, strategy, through_data):
    text, step, who, way_out = CASES[strategy]
    (tmp_path / "momentum.py").write_text(MOMENTUM)
    config = write_config(tmp_path, extra=(
        f"{text}\ncustom_imports = dict(imports=['digits', 'killer', 'momentum'], "
        f"allow_failed_imports=False)\nmodel = dict(type='MomentumMLP', "
        f"through_data={through_data})\n"))
    done = flexgraph_run(str(config), "--work-dir", "work", "--nproc-per-node", "2",
                         cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: step {step!r} broke contract 'forward_writes_kept' during training: {who}: "
        f"the forward wrote in place to parameter 'momentum.weight' and 1 more "
        f"{way_out}"], done.stderr[-3000:]
    assert not list((tmp_path / "work").rglob("iter_*")), "stopped before any checkpoint"
