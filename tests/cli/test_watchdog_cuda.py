"""The watchdog on CUDA, through NCCL's own means; skips without CUDA.

With one process per visible GPU (DDP on NCCL), under ``--max-restarts 1`` so that
one GPU is a launch too: the process group gets NCCL's asynchronous error handling,
its flight recorder and a dump location in the run's watch folder; a rank blocked
in a hook is reported with every rank's stacks and the flight recorder's record of
its last collectives, and the group restarts and finishes. With two GPUs or more,
the watchdog off and a short ``dist_cfg.timeout``, NCCL's own timeout ends the run
and dumps its record where the watchdog would have put it.
"""

from __future__ import annotations

import json
import pickle
import re

import pytest
import torch

from tests.cli.cli_helpers import final_state
from tests.cli.watch_helpers import STALL_LINE, Run, flexgraph_argv, stalled_at, write_config

GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device"), pytest.mark.slow]
DDP = "strategy = dict(type='DDPStrategy')\n"


def test_a_stall_on_nccl_is_reported_with_the_flight_recorders_record(tmp_path):
    rank = GPUS - 1  # the last rank stalls (rank 0 on one GPU)
    config = write_config(tmp_path / "cfg", "sleep", rank=rank, extra=DDP)
    work = tmp_path / "work"
    run = Run(flexgraph_argv(config, "--work-dir", str(work), "--nproc-per-node", str(GPUS),
                             "--max-restarts", "1", "--cfg-options",
                             "env_cfg.stall_timeout=20", "env_cfg.shutdown_timeout=10"),
              cwd=tmp_path)
    stalled_at(work)
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    assert run.returncode == 0, run.stderr[-3000:]
    [warning] = [x for x in run.stderr.splitlines() if x.startswith("warning: ")]
    match = re.match("warning: " + STALL_LINE.format(rank=rank), warning)
    assert match, warning
    stacks = tmp_path / match[3]
    for r in range(GPUS):
        assert "most recent call first" in (stacks / f"rank{r}.txt").read_text()
        record = pickle.loads((stacks / f"collectives_rank{r}.pkl").read_bytes())
        assert record["entries"], f"rank {r}: the flight recorder kept no collective"
    group = json.loads((work / "group-rank0.json").read_text())
    assert group["backend"] == "nccl"
    assert group["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert group["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert group["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert "/.watchdog/" in group["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    assert "iter_4.pth: epoch 0, iter 4 (restart 1 of the group)" in run.stdout
    assert final_state(work)["meta"]["iter"] > 5  # the restarted group trained to the end


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices: one rank waits for the other")
def test_without_the_watchdog_nccl_times_out_ends_the_run_and_dumps_its_record(tmp_path):
    config = write_config(tmp_path / "cfg", "sleep", extra=(
        "strategy = dict(type='DDPStrategy', dist_cfg=dict(timeout=20))\n"))
    work = tmp_path / "work"
    run = Run(flexgraph_argv(config, "--work-dir", str(work), "--nproc-per-node", "2",
                             "--cfg-options", "env_cfg.stall_timeout=0",
                             "env_cfg.shutdown_timeout=5"), cwd=tmp_path)
    stalled = stalled_at(work)
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    assert run.gone_at - stalled <= 20 + 5 + 60, run.gone_at - stalled
    assert run.returncode != 0, run.stderr[-3000:]
    assert run.stderr.count("error: rank 0 ") == 1, run.stderr[-3000:]
    dumps = list(work.glob(".watchdog/*/attempt0/stacks/nccl_trace_rank_0"))
    assert dumps, "NCCL dumped no flight record on its timeout"
