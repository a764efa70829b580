"""SLURM as a launcher, both ways clusters run it, and its requeue after a preemption stop.

One task per rank (``srun -n8``): each task's place is written as torchrun's
variables. One task per node (``--nproc-per-node 8 --nnodes $SLURM_NNODES``):
each task launches its node's ranks. A run stopped by its preemption signal
saves, exits 75, and rank 0 asks SLURM to requeue the job.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping, MutableMapping

import attrs

from flexgraph.core.errors import FlexgraphError

LAUNCHERS = ("auto", "none", "pytorch", "slurm")
"""``--launcher`` values: MMEngine's (``none``, ``pytorch``, ``slurm``) and ``auto``."""
PORT_BASE, PORT_SPAN = 15000, 20000


class SlurmLaunchError(FlexgraphError, RuntimeError):
    """SLURM's variables do not describe the launch that was asked for."""


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist (``node[01-04,07],gpu5``: ``node01``)."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    if match is None or not (match.group(1) or match.group(2)):
        raise SlurmLaunchError(f"SLURM_JOB_NODELIST={nodelist!r} names no host; set "
                               f"MASTER_ADDR to the first node's address")
    prefix, ranges, suffix = match.groups()
    first = (ranges or "").split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix or ''}"


def tasks_per_node(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` (``'2(x3),1'``) as one count per node."""
    counts: list[int] = []
    for part in text.split(","):
        count, _, times = part.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    return counts


def job_port(job_id: str) -> int:
    """The rendezvous port of a job: every task of it derives the same one."""
    return PORT_BASE + int(re.sub(r"\D", "", job_id) or 0) % PORT_SPAN


def in_srun_step(env: Mapping[str, str]) -> bool:
    """This process is a task of an ``srun`` step (not the batch script itself)."""
    return "SLURM_STEP_ID" in env and "SLURM_PROCID" in env


def step_tasks(env: Mapping[str, str]) -> int:
    return int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)


def _rendezvous(env: Mapping[str, str]) -> tuple[str, int]:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    addr = env.get("MASTER_ADDR") or first_host(nodelist)
    port = int(env.get("MASTER_PORT") or job_port(env.get("SLURM_JOB_ID", "0")))
    return addr, port


def choose_launcher(requested: str | None, env: Mapping[str, str]) -> str:
    """``'slurm'``, or ``'none'`` (torch elastic's variables, if any, or one process).

    ``None`` or ``'auto'`` detects an ``srun`` step of several tasks.
    """
    if requested not in (None, *LAUNCHERS):
        raise SlurmLaunchError(f"launcher={requested!r} is not one of "
                               f"{', '.join(LAUNCHERS)} (flexgraph starts no MPI jobs)")
    if "TORCHELASTIC_RUN_ID" in env or requested == "pytorch":  # torch elastic's rank
        return "none"
    if requested == "slurm":
        if not in_srun_step(env):
            raise SlurmLaunchError("launcher 'slurm' (--launcher, or the config's launcher) "
                                   "needs SLURM's task variables (SLURM_PROCID, ...): start "
                                   "the run with srun, or pass --launcher none")
        return "slurm"
    if requested in (None, "auto") and in_srun_step(env) and step_tasks(env) > 1:
        return "slurm"
    return "none"


def become_slurm_rank(env: MutableMapping[str, str]) -> str:
    """Write this task's place as torchrun's variables into ``env``; say what it is."""
    ntasks, rank = step_tasks(env), int(env["SLURM_PROCID"])
    node = int(env.get("SLURM_NODEID", 0))
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or str(ntasks))
    addr, port = _rendezvous(env)
    env.update(RANK=str(rank), WORLD_SIZE=str(ntasks), LOCAL_RANK=env.get("SLURM_LOCALID", "0"),
               LOCAL_WORLD_SIZE=str(per_node[min(node, len(per_node) - 1)]),
               GROUP_RANK=str(node), MASTER_ADDR=addr, MASTER_PORT=str(port))
    return f"slurm ({ntasks} tasks, rendezvous {addr}:{port})"


@attrs.frozen
class SlurmNode:
    """Where SLURM placed one node's launcher: its node rank and the launchers' rendezvous."""

    nodes: int
    node_rank: int
    master_addr: str
    master_port: int

    def describe(self, nproc_per_node: int) -> str:
        return (f"slurm + torch elastic ({self.nodes} nodes x {nproc_per_node}, node "
                f"{self.node_rank}, rendezvous {self.master_addr}:{self.master_port})")


def slurm_node(nnodes: str, env: Mapping[str, str], *, master_addr: str | None = None,
               master_port: int | None = None) -> SlurmNode | None:
    """In an ``srun`` step, a launcher of ranks on each of ``nnodes`` nodes: its place.

    ``None`` outside an ``srun`` step, for a rank, and for one node.
    """
    if not in_srun_step(env) or "LOCAL_RANK" in env:
        return None
    nodes, tasks = int(str(nnodes).split(":")[-1]), step_tasks(env)
    if tasks != nodes:
        raise SlurmLaunchError(
            f"srun started {tasks} tasks but --nnodes is {nnodes}: with --nproc-per-node "
            f"each task launches one node's ranks; run one task per node (srun "
            f"--ntasks-per-node=1) with --nnodes $SLURM_NNODES")
    if nodes == 1:
        return None
    addr, port = _rendezvous(env)
    return SlurmNode(nodes, int(env["SLURM_PROCID"]), master_addr or addr, master_port or port)


def resume_after_requeue(resume: str | None, env: Mapping[str, str]) -> str | None:
    """``resume``, else ``'auto'`` in a requeued job (``SLURM_RESTART_COUNT`` > 0)."""
    if int(env.get("SLURM_RESTART_COUNT") or 0) > 0 and not resume:
        return "auto"
    return resume


def requeue_after_stop(signal_name: str, preempt_signals: tuple[str, ...],
                       env: Mapping[str, str]) -> None:
    """Ask SLURM to requeue this job after a stop on its preemption signal.

    SIGTERM and SIGINT are a user's, and SLURM requeues what it preempts itself;
    only SLURM's task 0 asks.
    """
    job = env.get("SLURM_JOB_ID")
    if not job or signal_name not in preempt_signals or env.get("SLURM_PROCID", "0") != "0":
        return
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                              timeout=60)
        failed = done.returncode != 0 and (done.stderr.strip() or f"exit {done.returncode}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed = str(exc)
    if failed:
        print(f"warning: SLURM did not requeue job {job} ({' '.join(str(failed).split())}); "
              f"submit it again (sbatch --requeue, or JobRequeue=1) to continue from the "
              f"checkpoint", file=sys.stderr, flush=True)
    else:
        print(f"flexgraph: asked SLURM to requeue job {job}; it resumes from this checkpoint",
              file=sys.stderr, flush=True)
