"""SIGKILL at random points of checkpoint saves, in a fast single-process harness.

A writer saves a 16 MB checkpoint after checkpoint (so a kill at a random
moment lands inside a save, at a random point of it: writing, fsync, the
rename into place, the pointer, pruning) and is SIGKILLed after a seeded random
delay. Every next trial resumes from the newest complete checkpoint, which must
be the last save the writer reported complete (or a later one), and every
checkpoint under a final name must read whole. Both IOs: one file, and DCP's
sharded directories (renamed into place and pruned as directories).
"""

from __future__ import annotations

import os
import random
import signal
import time
import traceback
from pathlib import Path

import pytest
import torch
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO

from flexgraph.training.checkpoint import Checkpointer
from flexgraph.training.config import CheckpointPolicy
from flexgraph.training.formats import dcp_load, read_checkpoint_file

SEED = 20240611
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


_SAVER_STATE = 4_000_000  # 16 MB of float32: a save takes long enough to be cut short


def _save_forever(work: Path, io_name: str, report_fd: int) -> None:
    """The writer: resume from the latest checkpoint, then save iteration after iteration."""
    io = DistributedCheckpointIO() if io_name == "dcp" else None
    checkpointer = Checkpointer(work, CheckpointPolicy(keep_last=2), io=io)
    latest = checkpointer.latest()
    start = 0 if latest is None else _iter_of(checkpointer, latest) + 1
    weights = torch.zeros(_SAVER_STATE)
    for i in range(start, start + 10_000):
        weights[0] = i
        state = {"meta": {"iter": i}, "state_dict": {"w": weights}}
        if io is not None:
            state["optimizer"] = {"step": torch.tensor(float(i))}
        checkpointer.save(state, f"iter_{i}")
        os.write(report_fd, f"{i}\n".encode())


def _iter_of(checkpointer: Checkpointer, path: Path) -> int:
    """The iteration a checkpoint holds, checked against its name and its weights."""
    if path.suffix == ".dcp":
        state = {"state_dict": {"w": torch.zeros(_SAVER_STATE)}}
        dcp_load(state, path)
        meta = read_checkpoint_file(path / "extra.pth")["meta"]
    else:
        state = read_checkpoint_file(path)
        meta = state["meta"]
    assert path.name == f"iter_{meta['iter']}{checkpointer.io.suffix}"
    assert state["state_dict"]["w"][0].item() == meta["iter"], path
    return meta["iter"]


@pytest.mark.parametrize("io_name", ["file", "dcp"])
def test_sigkill_at_random_points_of_saves_never_loses_the_last_complete_checkpoint(
        tmp_path, io_name):
    """Trials of a writer killed mid-save; each next trial resumes where the last ended."""
    work = tmp_path / "work"
    rng = random.Random(SEED + len(io_name))
    trials = 6  # per IO: 12 in all
    resumed_at = -1
    for trial in range(trials):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: save until killed
            os.close(read_end)
            try:
                torch.set_num_threads(1)
                _save_forever(work, io_name, write_end)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as reports:
            first = int(reports.readline())  # its first save is complete
            assert first == resumed_at + 1, "it resumed from the last complete checkpoint"
            delay = rng.uniform(0.0, 0.4)
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            completed = [first] + [int(x) for x in reports.read().split()]
        checkpointer = Checkpointer(work, io=DistributedCheckpointIO() if io_name == "dcp"
                                    else None)
        latest = checkpointer.latest()
        resumed_at = _iter_of(checkpointer, latest)
        torn = sorted(p.name for p in work.glob(".tmp-*"))
        print(f"{io_name} trial {trial}: killed {delay:.3f}s in, after save "
              f"{completed[-1]}; latest complete: {latest.name}; left behind: {torn}")
        assert resumed_at >= completed[-1], "a completed save was lost"
        for path, problem in checkpointer.candidates():
            assert problem is None, problem  # under a final name: whole, or not there
            _iter_of(checkpointer, path)
