"""``flexgraph run`` under a real SLURM, both ways clusters launch it, and its requeue.

The cluster (``slurm_cluster.py``) is started once for the whole test run; the
runs are real ``srun`` steps and ``sbatch`` jobs of it, each task a rank:

- ``srun -n2 flexgraph run --nproc-per-node 1 --nnodes 2``: each task launches
  one "node" with torch's elastic agent, the rendezvous filled in from SLURM;
- ``srun -n2 flexgraph run``: two tasks are two ranks of one run (FSDP here,
  DDP in the job below), every hook firing on both;
- ``examples/slurm/train.sbatch``, stopped with ``scancel --signal=USR1``: it
  saves, requeues itself, and the requeued job resumes to the very weights of
  the first form's run, never stopped; meanwhile a second run on its work_dir
  is refused on every rank.

Each run costs seconds of start-up (two processes importing torch on a small
machine), so each is made once and read by every test that needs it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flexgraph.training.output import LOCK_FILE
from tests.cli.cli_helpers import (
    ROOT,
    assert_same_training_state,
    final_state,
    hook_trace,
    train_losses,
    write_config,
)
from tests.cli.slurm_cluster import Cluster, SlurmUnavailable, start_cluster

pytestmark = pytest.mark.slow

SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
PAUSE_AT = 6  # iterations; the ranks agree on a stop every 5, so a stop lands on 10

PAUSE = textwrap.dedent(
    '''
    """Test-only hook: on the first attempt, wait at an iteration until the test says go."""
    import os
    import time

    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS


    @HOOKS.register_module(force=True)
    class PauseOnce(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            at = int(os.environ.get("PAUSE_AT", -1))
            if runner.iter + 1 != at or os.environ.get("SLURM_RESTART_COUNT"):
                return
            open(os.path.join(runner.work_dir, f"paused-rank{runner.rank}"), "w").close()
            go = os.path.join(runner.work_dir, "go")
            deadline = time.monotonic() + 60
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.05)
    '''
)
ONE_EPOCH = """
train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)
preemption = dict(check_interval=5)
custom_imports = dict(imports=['digits', 'killer', 'pause'], allow_failed_imports=False)
custom_hooks = [dict(type='Record'), dict(type='PauseOnce')]
"""


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as why:
        pytest.skip(str(why))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A folder with the config every run here trains: one epoch of digits, 23 iterations
    a rank, hooks recorded."""
    folder = tmp_path_factory.mktemp("slurm-runs")
    write_config(folder, extra=ONE_EPOCH)
    (folder / "pause.py").write_text(PAUSE)
    return folder


def _srun(slurm: Cluster, root: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    done = slurm.run("srun", *argv, cwd=root, extra_env=_run_env(**env))
    return done


def _run_env(**env: str) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT / "examples"), "OMP_NUM_THREADS": "1", **env}


def _flexgraph(*argv: str) -> list[str]:
    return [sys.executable, "-m", "flexgraph", "run", "cfg.py", *argv]


@pytest.fixture(scope="module")
def nodes_run(slurm, root) -> Path:
    """``srun -n2 flexgraph run --nproc-per-node 1 --nnodes 2``: two "nodes" of one rank each,
    launched by torch's elastic agent; the unstopped run the preempted one must equal."""
    done = _srun(slurm, root, "-n2", *_flexgraph("--work-dir", "nodes", "--nproc-per-node",
                                                 "1", "--nnodes", "2"))
    assert done.returncode == 0, done.stderr[-3000:] + slurm.logs()
    assert "launching with slurm + torch elastic (2 nodes x 1, node 0, rendezvous" in done.stdout
    return root / "nodes"


def _same_hooks_on_both_ranks(work: Path) -> list[str]:
    rank0, rank1 = hook_trace(work / "hooks-rank0.txt"), hook_trace(work / "hooks-rank1.txt")
    assert rank0 == rank1
    assert rank0[:4] == ["before_run", "before_train", "before_train_epoch", "train_iters*"]
    assert rank0[-2:] == ["after_train", "after_run"] and "after_val_epoch" in rank0
    return rank0


def test_one_task_per_node_launches_its_ranks_with_the_rendezvous_from_slurm(nodes_run):
    _same_hooks_on_both_ranks(nodes_run)
    assert max(train_losses(nodes_run)) == 23  # 1437 samples / 2 ranks / 32 a batch
    assert not (nodes_run / LOCK_FILE).exists()  # released as the run ended


def test_srun_tasks_are_the_ranks_of_one_fsdp_run(slurm, root):
    done = _srun(slurm, root, "-n2", *_flexgraph("--work-dir", "fsdp", "--strategy", "fsdp"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "strategy fsdp, launched by slurm (2 tasks, rendezvous " in done.stdout
    _same_hooks_on_both_ranks(root / "fsdp")


@pytest.fixture(scope="module")
def preempted_job(slurm, root) -> dict:
    """``examples/slurm/train.sbatch`` (``srun``: two tasks, two DDP ranks), paused at
    iteration 6 while a second run tries its work_dir, then ``scancel --signal=USR1``, its
    requeue, and the requeued job to the end. ``{work, log, second, job}``."""
    work, out = root / "preempted", root / "job.out"
    job = slurm.run("sbatch", "--parsable", f"--output={out}", str(SBATCH), "cfg.py",
                    "--work-dir", "preempted", cwd=root,
                    extra_env=_run_env(PAUSE_AT=str(PAUSE_AT),
                                       FLEXGRAPH=f"{sys.executable} -m flexgraph"))
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip().split(";")[0]
    slurm.wait_for_job(job_id, (work / "paused-rank0").exists)
    second = _srun(slurm, root, "-n2", *_flexgraph("--work-dir", "preempted"))

    assert slurm.run("scancel", "--signal=USR1", job_id).returncode == 0
    # rank 0 got it (its handler says so) before the ranks go on: they agree at iteration 10
    slurm.wait_for_job(job_id, lambda: "SIGUSR1: stopping" in out.read_text())
    (work / "go").touch()
    slurm.wait_for_job(job_id, lambda: slurm.job_field(job_id, "Restarts") == "1")
    # SLURM holds a requeued job for two minutes (its BeginTime); the test does not wait
    slurm.wait_for_job(job_id, lambda: slurm.job_field(job_id, "JobState") == "PENDING")
    assert slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now").returncode == 0
    slurm.wait_for_job(job_id, lambda: slurm.job_field(job_id, "JobState") == "COMPLETED")
    return {"work": work, "log": out.read_text(), "second": second, "job": job_id}


def test_srun_tasks_are_the_ranks_of_one_ddp_run(preempted_job):
    assert "strategy ddp, launched by slurm (2 tasks, rendezvous " in preempted_job["log"]
    trace = _same_hooks_on_both_ranks(preempted_job["work"])  # both attempts, in order
    assert "after_load_checkpoint" in trace


def test_a_second_run_on_an_owned_work_dir_is_refused_on_every_rank(preempted_job):
    second = preempted_job["second"]
    assert second.returncode == 2
    refusals = [x for x in second.stderr.splitlines() if x.startswith("error: ")]
    assert len(refusals) == 2, second.stderr
    assert all("preempted' belongs to another run (host " in x for x in refusals)


def test_usr1_saves_requeues_and_the_requeued_job_ends_as_an_unstopped_run(
        preempted_job, nodes_run):
    log, job = preempted_job["log"], preempted_job["job"]
    assert "stopped by SIGUSR1 after iteration 10 of 23" in log, log
    assert f"asked SLURM to requeue job {job}" in log
    assert f"job {job} on " in log and "restart 1" in log  # the requeued job's own line
    work = preempted_job["work"]
    assert "Resumed from" in log and f"{work.name}/iter_10.pth" in log
    assert_same_training_state(final_state(work), final_state(nodes_run))
    assert train_losses(work) == train_losses(nodes_run)
