"""Reading SLURM's variables: hostlists, tasks per node, and which launch they describe.

In-process checks of the parsing, over the variables a real ``srun`` sets (as
printed by ``srun -n2 env`` on the test cluster, and SLURM's documented
compressed forms). The launches themselves run under a real SLURM in
``test_slurm_cli.py``.
"""

from __future__ import annotations

import argparse

import pytest

from flexgraph.cli.slurm import (
    SlurmLaunchError,
    become_slurm_rank,
    choose_launcher,
    fill_node_launch,
    first_host,
    job_port,
    resume_after_requeue,
    tasks_per_node,
)
from flexgraph.training.runtime._distributed import visible_device_index

# what `srun -n4 -N2` sets in task 3 (second node, its second task)
TASK = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_NODELIST": "gpu[07-08]"}
BATCH = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
         "SLURM_JOB_NODELIST": "gpu[07-08]"}  # the batch script: no step


@pytest.mark.parametrize(("nodelist", "first"), [
    ("node[01-04,07]", "node01"), ("node[07,01-04]", "node07"), ("a1,b2", "a1"),
    ("rack3-n[009-012]-ib,rack4-n1", "rack3-n009-ib"), ("solo", "solo"),
])
def test_the_first_host_of_a_compressed_nodelist(nodelist, first):
    assert first_host(nodelist) == first


def test_an_empty_nodelist_says_to_set_master_addr():
    with pytest.raises(SlurmLaunchError, match="MASTER_ADDR"):
        first_host("")


def test_tasks_per_node_expands_repeats():
    assert tasks_per_node("3(x2),1,2(x1)") == [3, 3, 1, 2]


def test_every_task_of_a_job_derives_one_port_and_jobs_differ():
    assert job_port("4242") == job_port("4242") != job_port("4243")
    assert 1024 < job_port("99999999") < 65536


def test_a_task_becomes_a_rank_with_torchruns_variables():
    env = dict(TASK)
    assert become_slurm_rank(env) == f"slurm (4 tasks, rendezvous gpu07:{job_port('4242')})"
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "gpu07"}


def test_master_addr_and_port_that_are_set_win():
    env = {**TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    become_slurm_rank(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29400")


@pytest.mark.parametrize(("requested", "env", "chosen"), [
    (None, TASK, "slurm"),                         # an srun step of several tasks
    (None, {**TASK, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}, "none"),
    (None, BATCH, "none"),                         # the batch script itself
    ("none", TASK, "none"),
    ("pytorch", TASK, "none"),
    (None, {**TASK, "TORCHELASTIC_RUN_ID": "x"}, "none"),  # torchrun's rank inside a step
    ("slurm", {**TASK, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}, "slurm"),
])
def test_which_launcher(requested, env, chosen):
    assert choose_launcher(requested, env) == chosen


def test_launcher_slurm_outside_srun_and_mpi_are_refused():
    with pytest.raises(SlurmLaunchError, match="start the run with srun"):
        choose_launcher("slurm", BATCH)
    with pytest.raises(SlurmLaunchError, match="'mpi' is not one of"):
        choose_launcher("mpi", {})


def _launcher_args(nnodes: str, nproc: int = 8) -> argparse.Namespace:
    return argparse.Namespace(nnodes=nnodes, nproc_per_node=nproc, node_rank=0,
                              master_addr=None, master_port=None)


def test_one_task_per_node_gets_its_node_rank_and_the_rendezvous():
    args = _launcher_args("2")
    env = {**TASK, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}
    assert fill_node_launch(args, env).startswith("slurm + torch elastic (2 nodes x 8, node 1")
    assert (args.node_rank, args.master_addr, args.master_port) == (1, "gpu07", job_port("4242"))


def test_several_tasks_per_node_each_launching_ranks_is_refused():
    with pytest.raises(SlurmLaunchError, match=r"srun started 4 tasks but --nnodes is 2.*"
                                               r"--ntasks-per-node=1"):
        fill_node_launch(_launcher_args("2"), TASK)


def test_a_requeued_job_resumes_unless_told_otherwise():
    args = argparse.Namespace(resume=None)
    resume_after_requeue(args, {**BATCH, "SLURM_RESTART_COUNT": "1"})
    assert args.resume == "auto"
    args = argparse.Namespace(resume="work/iter_5.pth")
    resume_after_requeue(args, {**BATCH, "SLURM_RESTART_COUNT": "2"})
    assert args.resume == "work/iter_5.pth"


def test_each_rank_takes_the_accelerator_slurm_bound_to_it():
    assert visible_device_index(5, 8) == 5  # every device of the node visible
    assert visible_device_index(5, 1) == 0  # --gpus-per-task=1: its own only
    with pytest.raises(ValueError, match="local rank 5 has no accelerator of its own"):
        visible_device_index(5, 4)


def test_the_command_line_opts_out_or_is_refused_outside_srun(monkeypatch, capsys):
    """``flexgraph run`` in this process (``--dry-run``: it plans, runs nothing)."""
    from cli_helpers import QUICKSTART

    from flexgraph.cli.main import main

    monkeypatch.syspath_prepend(str(QUICKSTART.parent))
    for key, value in TASK.items():  # as srun -n4 would start this task
        monkeypatch.setenv(key, value)
    assert main(["run", str(QUICKSTART), "--launcher", "none", "--dry-run"]) == 0
    assert "strategy single: setup_env" in capsys.readouterr().out  # one process, on its own
    for key in TASK:
        monkeypatch.delenv(key)
    assert main(["run", str(QUICKSTART), "--launcher", "slurm", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: launcher 'slurm' (--launcher, or the config's launcher) "
                          "needs SLURM's task variables") and err.count("\n") == 1
