"""A real single-node SLURM cluster for the tests: munged, slurmctld and slurmd, in a folder.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them), configured the
way a container allows: ``proctrack/linuxproc`` (no cgroups), ``task/none``,
root as SlurmUser, one node with more CPUs than the machine has
(``config_overrides``) so that a few steps run side by side. Everything (the
munge key and socket, ``slurm.conf``, state, spool, logs, pid files) lives in
one folder, and the daemons listen on free ports: the cluster never touches a
system SLURM, nor another test session's.

:func:`start_cluster` returns a :class:`Cluster` once ``sinfo`` shows the node
idle (about a second). It raises :class:`SlurmUnavailable` where SLURM is not
installed (or cannot run: not root), and ``RuntimeError`` with the daemons'
logs where it is installed but did not start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SBIN = ("/usr/sbin", "/usr/bin", "/sbin")
JOB_REQUEUE_HOLD = 120
"""Seconds SLURM holds a requeued job before it may start again (its BeginTime)."""


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _conf(folder: Path, host: str) -> str:
    return f"""\
ClusterName=flexgraph-tests
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={folder}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
PlugStackConfig={folder}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=2
SchedulerParameters=sched_interval=1
NodeName={host} CPUs=16 State=UNKNOWN
PartitionName=tests Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmUnavailable(Exception):
    """SLURM cannot run on this machine (the tests skip, saying why)."""


class Cluster:
    """A running cluster: its ``SLURM_CONF`` and how to run its commands."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment for the cluster's clients, without an outer job's
        SLURM variables (the tests may themselves run under SLURM)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        bin_dir = os.path.dirname(sys.executable)  # `flexgraph` and `python` of this venv
        env.update(SLURM_CONF=str(self.conf), PATH=os.pathsep.join(
            [bin_dir, env.get("PATH", ""), *SBIN]), **extra)
        return env

    def run(self, *argv: str, timeout: float = 120,
            **kwargs: object) -> subprocess.CompletedProcess:
        """A SLURM client command (``srun``, ``sbatch``, ``scontrol``...) against this cluster."""
        env = self.env(**kwargs.pop("extra_env", {}))  # type: ignore[arg-type]
        return subprocess.run(list(argv), env=env, capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def job_field(self, job: str, field: str) -> str:
        """One ``Field=value`` of ``scontrol show job``."""
        text = self.run("scontrol", "show", "job", job).stdout
        return next((word.split("=", 1)[1] for word in text.split()
                     if word.startswith(field + "=")), "")

    def wait_for_job(self, job: str, done: callable, timeout: float = 120) -> None:
        """Poll ``done()`` every 0.2 s; on timeout say where the job was."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} is stuck: "
                                     f"{self.run('scontrol', 'show', 'job', job).stdout}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}"
                         for p in sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        for name in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((self.folder / name).read_text()), signal.SIGTERM)


def _start(argv: list[str], folder: Path) -> str | None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SLURM_CONF": str(folder / "slurm.conf")})
    return None if done.returncode == 0 else f"{argv[0]} failed: {done.stderr.strip()}"


def start_cluster(folder: Path) -> Cluster:
    """Bring up a cluster in ``folder`` (see the module docstring)."""
    daemons = {name: _which(name) for name in ("munged", "slurmctld", "slurmd", "srun")}
    missing = [name for name, path in daemons.items() if path is None]
    if missing:
        raise SlurmUnavailable(f"SLURM is not installed ({', '.join(missing)} missing; "
                               f"Debian: apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("a test cluster's slurmd runs jobs as root: run the SLURM "
                               "tests as root")
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (folder / "plugstack.conf").write_text("")
    host = socket.gethostname().split(".")[0]
    (folder / "slurm.conf").write_text(_conf(folder, host))
    munge = folder / "munge"
    cluster = Cluster(folder)
    steps = [
        [daemons["munged"], f"--key-file={key}", f"--socket={munge}/munge.socket",
         f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
         f"--seed-file={munge}/seed", "--force"],
        [daemons["slurmctld"], "-f", str(folder / "slurm.conf")],
        [daemons["slurmd"], "-f", str(folder / "slurm.conf")],
    ]
    for argv in steps:
        failed = _start(argv, folder)
        if failed:
            cluster.stop()
            raise RuntimeError(f"{failed}\n{cluster.logs()}")
    deadline = time.monotonic() + 30
    while cluster.run("sinfo", "-h", "-o", "%t").stdout.strip() != "idle":
        if time.monotonic() > deadline:
            cluster.stop()
            raise RuntimeError(f"the test cluster's node never became idle\n{cluster.logs()}")
        time.sleep(0.2)
    return cluster
