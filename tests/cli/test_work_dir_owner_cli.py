"""``flexgraph run`` on a work_dir that another run owns: refused at once, in one line.

The owner here is this test process holding the lock (another process, for the
run under test); runs that really overlap are in ``test_slurm_cli.py``, under
SLURM, where they used to race.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from flexgraph.cli.main import main
from flexgraph.training.output import LOCK_FILE, take_work_dir
from tests.cli.cli_helpers import QUICKSTART, flexgraph_run


def _refusal(work: Path) -> str:
    return (f"error: work_dir {str(work)!r} belongs to another run "
            f"(host {socket.gethostname()} pid {os.getpid()}")


@pytest.mark.slow
def test_a_launcher_on_an_owned_work_dir_stops_before_starting_ranks(tmp_path):
    work = tmp_path / "work"
    with take_work_dir(work, "the-owner"):
        done = flexgraph_run(str(QUICKSTART), "--work-dir", str(work), "--nproc-per-node", "2",
                             cwd=tmp_path)
        assert sorted(p.name for p in work.iterdir()) == [LOCK_FILE]  # the owner's, only
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(_refusal(work)), done.stderr
    assert "flexgraph: " not in done.stdout  # not even the plan summary: no rank started


def test_a_process_on_an_owned_work_dir_stops_before_writing_anything(tmp_path, capsys,
                                                                       monkeypatch):
    """In this process (``main``): the lock is another open file, refused as another process's."""
    monkeypatch.syspath_prepend(str(QUICKSTART.parent))
    work = tmp_path / "work"
    with take_work_dir(work, "the-owner"):
        assert main(["run", str(QUICKSTART), "--work-dir", str(work)]) == 2
        assert sorted(p.name for p in work.iterdir()) == [LOCK_FILE]
    err = capsys.readouterr().err
    assert err.startswith(_refusal(work)) and err.count("\n") == 1, err
