"""Reading SLURM's variables: hostlists, tasks per node, and which launch they describe.

In-process checks of the parsing, over the variables a real ``srun`` sets (as
printed by ``srun -n2 env`` on the test cluster, and SLURM's documented
compressed forms). The launches themselves run under a real SLURM in
``test_slurm_cli.py``.
"""

from __future__ import annotations

import os

import pytest

from flexgraph.cli.slurm import (
    SlurmLaunchError,
    become_slurm_rank,
    choose_launcher,
    first_host,
    job_port,
    resume_after_requeue,
    slurm_node,
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


def test_one_task_per_node_gets_its_node_rank_and_the_rendezvous():
    env = {**TASK, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}
    node = slurm_node("2", env)
    assert node.describe(8).startswith("slurm + torch elastic (2 nodes x 8, node 1")
    assert (node.node_rank, node.master_addr, node.master_port) == (1, "gpu07", job_port("4242"))
    given = slurm_node("2", env, master_addr="head", master_port=29400)
    assert (given.master_addr, given.master_port) == ("head", 29400), "the flags win"
    assert slurm_node("1", {**env, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}) is None, \
        "one node: the launcher's own rendezvous"


def test_several_tasks_per_node_each_launching_ranks_is_refused():
    with pytest.raises(SlurmLaunchError, match=r"srun started 4 tasks but --nnodes is 2.*"
                                               r"--ntasks-per-node=1"):
        slurm_node("2", TASK)


def test_a_requeued_job_resumes_unless_told_otherwise():
    assert resume_after_requeue(None, {**BATCH, "SLURM_RESTART_COUNT": "1"}) == "auto"
    assert resume_after_requeue(None, {**BATCH, "SLURM_RESTART_COUNT": "0"}) is None
    given = resume_after_requeue("work/iter_5.pth", {**BATCH, "SLURM_RESTART_COUNT": "2"})
    assert given == "work/iter_5.pth"


def test_each_rank_takes_the_accelerator_slurm_bound_to_it():
    assert visible_device_index(5, 8) == 5  # every device of the node visible
    assert visible_device_index(5, 1) == 0  # --gpus-per-task=1: its own only
    with pytest.raises(ValueError, match="local rank 5 has no accelerator of its own"):
        visible_device_index(5, 4)


def test_the_command_line_opts_out_or_is_refused_outside_srun(monkeypatch, capsys):
    """``flexgraph run`` in this process (``--dry-run``: it plans, runs nothing)."""
    from flexgraph.cli.main import main
    from tests.cli.cli_helpers import QUICKSTART

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


# -- the launch's facts, as `flexgraph run` takes them from SLURM ---------------------------

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _in_environment(monkeypatch, env: dict[str, str]) -> None:
    """``env`` as this process's SLURM variables, and none of torchrun's.

    Each name is set before it is deleted, so that the test's end restores it
    (or removes it) even when the code under test writes it (``become_slurm_rank``
    does): ``delenv`` of an absent name records nothing to undo.
    """
    for name in {*_TORCHRUN_VARS, *TASK, *BATCH}:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _parsed(*flags: str):
    from flexgraph.cli.main import build_parser

    argv = ["run", "cfg.py", *flags]
    return build_parser(argv).parse_args(argv)


class _Pipeline:
    cfg = None  # no config keys: the launcher is detected


def test_a_task_per_rank_takes_its_place_from_slurm_into_the_launch_facts(monkeypatch):
    from flexgraph.cli.run_cmd import _choose_launch
    from flexgraph.training.output import LaunchFacts

    _in_environment(monkeypatch, TASK)
    args = _parsed()
    facts = LaunchFacts(resume="auto", **_choose_launch(args, _Pipeline()))
    assert facts.launched_by == f"slurm (4 tasks, rendezvous gpu07:{job_port('4242')})"
    assert (facts.launched, facts.launches_ranks, facts.resume) == (True, False, "auto")
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("3", "4"), "torch reads these"


def test_a_launcher_per_node_takes_its_node_rank_from_slurm_and_leaves_the_flags_alone(
        monkeypatch):
    from flexgraph.cli.launch import _rank_argv
    from flexgraph.cli.run_cmd import _choose_launch
    from flexgraph.training.output import LaunchFacts

    _in_environment(monkeypatch, {**TASK, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
                                  "SLURM_NTASKS": "2"})
    args = _parsed("--nproc-per-node", "2", "--nnodes", "2")
    facts = LaunchFacts(resume="auto", **_choose_launch(args, _Pipeline()))
    assert facts.launches_ranks and not facts.launched
    assert (facts.node_rank, facts.master_addr, facts.master_port) == \
        (1, "gpu07", job_port("4242"))
    assert facts.launched_by.startswith("slurm + torch elastic (2 nodes x 2, node 1")
    assert (args.node_rank, args.master_addr, args.master_port, args.resume) == \
        (0, None, None, None), "what SLURM says is the launch's, not written into the flags"
    argv = _rank_argv(args, facts)
    assert argv[argv.index("--resume") + 1] == "auto", "the ranks resume as the launch does"
