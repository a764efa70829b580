"""Checkpoint files: safe loading, load_from, atomic saves, plain scheduler state, and
the three parts of an IO."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO, FullStateFileIO

from flexgraph.training.checkpoint import (
    Checkpointer,
    CheckpointIO,
    CheckpointRestorer,
    CheckpointWriter,
    FileCheckpointIO,
    FileStateRestorer,
    PortableCheckpointIO,
    TorchStateAccess,
    WeightLoader,
)
from flexgraph.training.checkpoint._state import from_plain, to_plain
from flexgraph.training.config import CheckpointPolicy
from flexgraph.training.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)
from flexgraph.training.formats import read_checkpoint_file
from tests.training.training_helpers import REPO, Payload, run_steps


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, make_cfg, writer):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pth"
    payload = {"state_dict": {"head.weight": torch.zeros(3, 16)}, "x": Payload(marker)}
    with open(evil, "wb") as f:
        torch.save(payload, f) if writer == "torch.save" else pickle.dump(payload, f)

    with pytest.raises(UnsafeCheckpointError, match="refused"):
        read_checkpoint_file(evil)
    with pytest.raises(UnsafeCheckpointError):
        run_steps(make_cfg(load_from=str(evil)), last="load_checkpoint")
    with pytest.raises(UnsafeCheckpointError):
        run_steps(make_cfg(resume=str(evil)), last="resume")
    assert not marker.exists()


def test_missing_and_truncated_files_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        read_checkpoint_file(tmp_path / "nope.pth")
    good = tmp_path / "good.pth"
    torch.save({"w": torch.ones(1000)}, good)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[:500])
    with pytest.raises(CheckpointError, match="truncated.pth. is truncated"):
        read_checkpoint_file(truncated)


def test_load_from_raw_state_dict(tmp_path, make_cfg):
    trained = run_steps(make_cfg())["model"]
    raw = tmp_path / "raw.pth"
    torch.save(trained.state_dict(), raw)
    ddp_style = tmp_path / "ddp.pth"
    torch.save({"module." + k: v for k, v in trained.state_dict().items()}, ddp_style)
    for path in (raw, ddp_style, tmp_path / "work" / "epoch_3.pth"):
        fresh = run_steps(make_cfg(load_from=str(path)), last="wrap_model")["model"]
        for key, value in trained.state_dict().items():
            assert torch.equal(fresh.state_dict()[key], value), (path.name, key)


def test_load_from_a_file_with_no_matching_weights_is_refused(tmp_path, make_cfg):
    other = tmp_path / "other.pth"
    torch.save({"encoder.weight": torch.zeros(2, 2)}, other)
    with pytest.raises(CheckpointError, match="none of the 1 weights"):
        run_steps(make_cfg(load_from=str(other)), last="load_checkpoint")
    notes = tmp_path / "notes.pth"
    torch.save({"epoch": 3, "note": "no tensors"}, notes)
    with pytest.raises(CheckpointError, match="holds no model weights"):
        run_steps(make_cfg(load_from=str(notes)), last="load_checkpoint")


class _FailsToPickle:
    def __reduce__(self):
        raise RuntimeError("disk full (simulated)")


def test_failed_save_leaves_previous_checkpoint_and_pointer(tmp_path):
    ck = Checkpointer(tmp_path, CheckpointPolicy(keep_last=1))
    ck.save({"meta": {"iter": 1}, "w": torch.ones(3)}, "iter_1")
    with pytest.raises(RuntimeError, match="disk full"):
        ck.save({"meta": {"iter": 2}, "w": torch.ones(3), "bad": _FailsToPickle()},
                "iter_2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_1.pth", "last_checkpoint"]
    assert ck.latest() == tmp_path / "iter_1.pth"
    assert torch.equal(read_checkpoint_file(ck.latest())["w"], torch.ones(3))


def test_latest_skips_incomplete_files_without_pointer(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.save({"meta": {"iter": 5}}, "iter_5")
    (tmp_path / "last_checkpoint").unlink()
    time.sleep(0.01)
    (tmp_path / "iter_10.pth").write_bytes(b"PK\x03\x04 half a zip")  # newer, incomplete
    assert ck.latest() == tmp_path / "iter_5.pth"


_WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    from flexgraph.training.checkpoint import Checkpointer
    from flexgraph.training.config import CheckpointPolicy
    ck = Checkpointer({work!r}, CheckpointPolicy(keep_last=2))
    big = torch.randn(4_000_000)  # 16 MB: a save takes long enough to be interrupted
    for i in range(1, 10_000):
        big[0] = i
        ck.save({{"meta": {{"iter": i}}, "w": big}}, f"iter_{{i}}")
""")


@pytest.mark.slow
def test_kill_9_during_saves_never_damages_the_last_good_checkpoint(tmp_path):
    work = tmp_path / "work"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(repo=str(REPO), work=str(work)))
    # Kill points are random; tests/cli/test_run_cli.py kills inside a save on purpose.
    for delay in (0.05, 0.13, 0.29):
        child = subprocess.Popen([sys.executable, str(script)])
        try:
            deadline = time.monotonic() + 60
            while not (work / "last_checkpoint").exists():
                assert time.monotonic() < deadline and child.poll() is None
                time.sleep(0.01)
            time.sleep(delay)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        latest = Checkpointer(work).latest()
        state = read_checkpoint_file(latest)
        assert state["w"][0].item() == state["meta"]["iter"]
        for path in work.glob("iter_*.pth"):  # every file under a final name is whole
            read_checkpoint_file(path)


def test_scheduler_state_survives_weights_only_round_trip(tmp_path):
    from mmengine.optim import MultiStepLR, OptimWrapper

    model = torch.nn.Linear(2, 2)
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    sched = MultiStepLR(ow, milestones=[2, 2, 5], gamma=0.5)
    state = sched.state_dict()
    assert any(type(v).__name__ == "Counter" for v in state.values())
    path = tmp_path / "s.pth"
    torch.save({"s": to_plain(state)}, path)
    restored = from_plain(read_checkpoint_file(path)["s"])
    assert restored == state and type(restored["milestones"]) is type(state["milestones"])


def test_no_checkpoint_class_has_a_method_it_cannot_do():
    """A restorer of another strategy's format neither writes nor loads weights; every
    IO saves, restores and loads; an IO leaving a part out cannot be built."""
    restorer = FileStateRestorer(TorchStateAccess())
    assert isinstance(restorer, CheckpointRestorer)
    assert not isinstance(restorer, (CheckpointWriter, WeightLoader))
    assert not any(hasattr(restorer, name) for name in
                   ("states", "write", "size_needed", "remove", "load_weights"))
    for io in (FileCheckpointIO(), FullStateFileIO(), DistributedCheckpointIO(),
               PortableCheckpointIO()):
        assert all(isinstance(io, part) for part in
                   (CheckpointWriter, CheckpointRestorer, WeightLoader)), io
    half = type("WritesOnly", (CheckpointIO,), {"states": lambda self, model, optim: {},
                                                "write": lambda self, *a, **k: None})
    with pytest.raises(TypeError, match="abstract"):
        half()
