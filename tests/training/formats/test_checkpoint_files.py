"""Damaged and foreign checkpoint files: one line naming the file and what is wrong.

For ``read_checkpoint_file`` (every whole-file load), ``load_from`` and
``resume``; sharded (DCP) directories are written here without a process group
(DCP's single-process mode). ``--resume auto`` over a damaged work_dir skips
what it cannot use. Under two ranks: tests/cli/test_chaos_cli.py and
tests/cli/test_fsdp_cli.py.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO

from flexgraph.training.checkpoint import Checkpointer
from flexgraph.training.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)
from flexgraph.training.formats import dcp_problem, read_checkpoint_file
from tests.training.training_helpers import run_steps

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("good") / "good.pth"
    torch.manual_seed(0)
    torch.save({"meta": {"iter": 3}, "state_dict": torch.nn.Linear(32, 16).state_dict()}, path)
    return path


def _with_data_pkl(good: Path, path: Path, payload: bytes) -> Path:
    """``good`` with its pickle replaced by ``payload`` (the zip and its CRCs stay valid)."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info.filename, payload if info.filename.endswith("data.pkl") else data)
    return path


def _flipped(good: Path, path: Path, at: int) -> Path:
    data = bytearray(good.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


BAD = {  # name -> (make it from the good file, what the message says)
    "empty": (lambda g, p: p.write_bytes(b""), "is empty (0 bytes)"),
    "truncated": (lambda g, p: p.write_bytes(g.read_bytes()[:700]), "is truncated"),
    "bit flip": (lambda g, p: _flipped(g, p, g.stat().st_size // 2),
                 "fails the CRC-32 check"),
    "broken pickle": (lambda g, p: _with_data_pkl(g, p, b"\x80\x02t."),
                      "is corrupt: torch.load fails with IndexError: pop from empty list"),
    "text": (lambda g, p: p.write_text(json.dumps({"w": [1, 2]})),
             'is not a torch checkpoint: it looks like a text file'),
    "npy": (lambda g, p: np.save(p.open("wb"), np.zeros(3)), "looks like a NumPy .npy file"),
    "npz": (lambda g, p: np.savez(p.open("wb"), a=np.zeros(3)),
            "is a zip archive but not a torch.save file: it has no data.pkl"),
    "safetensors": (lambda g, p: p.write_bytes((18).to_bytes(8, "little")
                                               + b'{"w":{"dtype":"F"}}' + bytes(8)),
                    "looks like a safetensors file"),
    "directory": (lambda g, p: (p.mkdir(), (p / "notes.txt").write_text("x")),
                  "is a directory, not a checkpoint file"),
    "empty directory": (lambda g, p: p.mkdir(), "is an empty directory"),
    "sharded directory": (lambda g, p: (p.mkdir(), (p / ".metadata").write_bytes(b"")),
                          "is a sharded checkpoint directory"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_file_is_one_line_that_names_it_and_the_problem(tmp_path, good, kind):
    make, says = BAD[kind]
    path = tmp_path / "ckpt.pth"
    make(good, path)
    with pytest.raises(CheckpointError) as raised:
        read_checkpoint_file(path)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint '{path}' ") and says in message, message


def test_a_plain_pickle_is_refused_unread_and_a_missing_file_is_not_found(tmp_path):
    plain = tmp_path / "plain.pth"
    plain.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    with pytest.raises(UnsafeCheckpointError, match="a plain Python pickle"):
        read_checkpoint_file(plain)
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        read_checkpoint_file(tmp_path / "nope.pth")


def test_no_byte_of_a_checkpoint_can_change_without_an_error_or_a_harmless_load(tmp_path, good):
    """Flip random bytes: every load fails with a CheckpointError or returns the same tensors."""
    original = read_checkpoint_file(good)["state_dict"]
    rng = random.Random(3)
    errors = 0
    for trial in range(150):
        path = _flipped(good, tmp_path / f"{trial}.pth", rng.randrange(good.stat().st_size))
        try:
            loaded = read_checkpoint_file(path)["state_dict"]
        except CheckpointError:
            errors += 1
            continue
        for key, value in original.items():
            assert torch.equal(loaded[key], value), (trial, key)
    assert errors > 100


def test_a_restore_maps_only_the_weights_and_still_checks_every_record(tmp_path, good):
    """``FileCheckpointIO.read`` maps the file: the weights stay in the map until
    ``apply`` copies them into the model; the optimizer state (which the optimizer
    would keep) is copied out at once; a changed byte of a tensor is still refused."""
    from mmengine.optim import OptimWrapper

    from flexgraph.training.checkpoint import FileCheckpointIO

    model = torch.nn.Linear(32, 16)
    wrapper = OptimWrapper(torch.optim.Adam(model.parameters()))
    wrapper.update_params(model(torch.ones(2, 32)).sum())
    io, path = FileCheckpointIO(), tmp_path / "ckpt.pth"
    io.write({"meta": {"iter": 1}, **io.states(model, wrapper)}, path)

    read = io.read(path)
    ranges = [[int(x, 16) for x in line.split()[0].split("-")]
              for line in Path("/proc/self/maps").read_text().splitlines()
              if line.endswith(str(path))]  # the file's maps in this process

    def mapped(value):
        return any(low <= value.data_ptr() < high for low, high in ranges)

    assert all(mapped(v) for v in read["state_dict"].values())
    assert not any(mapped(v) for s in read["optimizer"]["state"].values() for v in s.values())
    fresh = torch.nn.Linear(32, 16)
    fresh_wrapper = OptimWrapper(torch.optim.Adam(fresh.parameters()))
    io.apply(read, path, model=fresh, optim_wrapper=fresh_wrapper)
    assert not any(mapped(v) for v in fresh.state_dict().values())
    assert torch.equal(fresh.weight, model.weight)
    state = fresh_wrapper.optimizer.state_dict()["state"]
    assert torch.equal(state[0]["exp_avg"], wrapper.optimizer.state_dict()["state"][0]["exp_avg"])
    assert not any(mapped(v) for s in state.values() for v in s.values())
    del read  # what the restore read goes: the file is no longer mapped (pruning frees it)
    assert str(path) not in Path("/proc/self/maps").read_text()

    with zipfile.ZipFile(path) as archive:
        record = next(m for m in archive.infolist() if "/data/" in m.filename
                      and m.file_size == 32 * 16 * 4)
    flipped = _flipped(path, tmp_path / "flipped.pth", record.header_offset + 100
                       + len(record.filename) + len(record.extra))
    with pytest.raises(CheckpointError, match="fails the CRC-32 check"):
        io.read(flipped)


def test_files_written_without_crcs_are_not_taken_for_corrupt(tmp_path):
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({"w": torch.ones(8)}, tmp_path / "nocrc.pth")
    finally:
        torch.serialization.set_crc32_options(True)
    assert torch.equal(read_checkpoint_file(tmp_path / "nocrc.pth")["w"], torch.ones(8))


@pytest.mark.parametrize("kind", ["truncated", "broken pickle", "directory", "text"])
def test_load_from_and_resume_name_the_bad_file(tmp_path, make_cfg, good, kind):
    path = tmp_path / "bad.pth"
    BAD[kind][0](good, path)
    for key, last in (("load_from", "load_checkpoint"), ("resume", "resume")):
        with pytest.raises(CheckpointError, match=f"checkpoint '{path}' "):
            run_steps(make_cfg(**{key: str(path)}), last=last)


def _trained(make_cfg, work: Path):
    hooks = dict(checkpoint=dict(type="CheckpointHook", interval=10, by_epoch=False),
                 logger=dict(type="LoggerHook", interval=10))
    run_steps(make_cfg(work_dir=str(work), default_hooks=hooks))  # iter_10, _20, _30
    return hooks


def test_resume_auto_skips_damaged_checkpoints_for_the_newest_good_one(tmp_path, make_cfg):
    work = tmp_path / "work"
    hooks = _trained(make_cfg, work)
    _flipped(work / "iter_30.pth", work / "iter_30.pth", 2000)  # the pointer's
    (work / "iter_20.pth").write_bytes((work / "iter_20.pth").read_bytes()[:999])
    checkpointer = Checkpointer(work)
    assert [(p.name, bool(problem)) for p, problem in checkpointer.candidates()] == [
        ("iter_30.pth", False), ("iter_20.pth", True), ("iter_10.pth", False)]
    resumed = run_steps(make_cfg(work_dir=str(work), default_hooks=hooks, resume="auto"),
                        last="resume")
    assert resumed["loop_state"].resumed_from == str(work / "iter_10.pth")
    assert resumed["loop_state"].iter == 10

    (work / "iter_10.pth").write_bytes(b"")
    with pytest.raises(CheckpointError, match="none of the 3 checkpoints .* can be resumed"):
        run_steps(make_cfg(work_dir=str(work), default_hooks=hooks, resume="auto"),
                  last="resume")


def _dcp_checkpoint(path: Path) -> Path:
    """A sharded checkpoint written by DCP in one process (no process group)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    io = DistributedCheckpointIO()
    state = {"meta": {"iter": 5}, **io.states(model, None)}
    io.write(state, path)
    return path


DCP_DAMAGE = {
    "a truncated shard": (lambda p: (p / "__0_0.distcp").write_bytes(
        (p / "__0_0.distcp").read_bytes()[:100]), "is truncated: its shard __0_0.distcp"),
    "a missing shard": (lambda p: (p / "__0_0.distcp").unlink(),
                        "its shard __0_0.distcp is missing"),
    "a corrupt .metadata": (lambda p: (p / ".metadata").write_bytes(
        (p / ".metadata").read_bytes()[:50]), "is corrupt: its .metadata cannot be read"),
    "no extra.pth": (lambda p: (p / "extra.pth").unlink(), "has no extra.pth"),
    "an empty extra.pth": (lambda p: (p / "extra.pth").write_bytes(b""), "is empty"),
    "no .metadata": (lambda p: (p / ".metadata").unlink(), "it has no .metadata"),
}


@pytest.mark.parametrize("damage", sorted(DCP_DAMAGE))
def test_a_damaged_sharded_checkpoint_is_named_with_its_problem(tmp_path, damage):
    path = _dcp_checkpoint(tmp_path / "iter_5.dcp")
    assert dcp_problem(path) is None
    harm, says = DCP_DAMAGE[damage]
    harm(path)
    problem = dcp_problem(path)
    assert problem is not None and says in problem and str(path) in problem, problem
    with pytest.raises(CheckpointError, match="iter_5.dcp"):
        DistributedCheckpointIO().read(path)
    assert Checkpointer(tmp_path, io=DistributedCheckpointIO()).latest() is None


def test_a_file_where_a_sharded_checkpoint_belongs_says_so(tmp_path, good):
    shutil.copy(good, tmp_path / "iter_5.dcp")
    assert "is a file, but this strategy's checkpoints are sharded" in dcp_problem(
        tmp_path / "iter_5.dcp")


def test_every_name_the_formats_face_lists_is_there():
    """The face loads its torch-backed names on first use: each one it lists resolves."""
    import flexgraph.training.formats as formats

    assert [name for name in formats.__all__ if not hasattr(formats, name)] == []
