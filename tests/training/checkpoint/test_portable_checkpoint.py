"""The portable checkpoint format in one process: what it holds, how it is read back.

Distributed writers and readers (DDP, FSDP2, DeepSpeed ZeRO) are covered end to
end in tests/cli/test_portable_resume_cli.py; here the format itself: state by
parameter name, the manifest written last, incomplete checkpoints skipped by
name, one-file checkpoints renumbered by name, the converter's functions.
"""

from __future__ import annotations

import json

import pytest
import torch
from mmengine.optim import OptimWrapper

from flexgraph.render.plan_change import plan_changes
from flexgraph.training.checkpoint import (
    Checkpointer,
    FileCheckpointIO,
    FileStateRestorer,
    PortableCheckpointIO,
    TorchStateAccess,
    portable_tensors,
    read_manifest,
    read_portable_tensor,
    write_portable,
)
from flexgraph.training.checkpoint._access import positions_to_names
from flexgraph.training.checkpoint_tools import describe_checkpoint
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import MANIFEST_NAME, PORTABLE_DIRECTORY, format_of


def _trained(steps: int = 3, seed: int = 0) -> tuple[torch.nn.Module, OptimWrapper]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    wrapper = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-2))
    for _ in range(steps):
        wrapper.update_params(model(torch.randn(5, 4)).square().mean())
    return model, wrapper


def _save(checkpointer: Checkpointer, model, wrapper, iteration: int):
    checkpoint = checkpointer.snapshot(model=model, optim_wrapper=wrapper, param_schedulers=[],
                                       epoch=0, iteration=iteration, batch_idx=iteration,
                                       seed=0, global_batch=5)
    return checkpointer.save(checkpoint, f"iter_{iteration}", model=model,
                             optim_wrapper=wrapper)


def _assert_same_state(model, wrapper, other_model, other_wrapper):
    for (name, a), (_, b) in zip(model.state_dict().items(), other_model.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    mine, theirs = wrapper.optimizer.state_dict(), other_wrapper.optimizer.state_dict()
    assert mine["state"].keys() == theirs["state"].keys()
    for pid, state in mine["state"].items():
        for key, value in state.items():
            assert torch.equal(value, theirs["state"][pid][key]), (pid, key)


def test_a_portable_checkpoint_restores_weights_and_adam_state_by_name(tmp_path):
    model, wrapper = _trained()
    checkpointer = Checkpointer(tmp_path, io=PortableCheckpointIO())
    path = _save(checkpointer, model, wrapper, 3)
    assert path.name == "iter_3.ckpt" and format_of(path) == PORTABLE_DIRECTORY
    assert set(portable_tensors(path)) == {
        *(f"model.{n}" for n in model.state_dict()),
        *(f"optimizer.{n}.{k}" for n, _ in model.named_parameters()
          for k in ("exp_avg", "exp_avg_sq", "step"))}
    manifest = read_manifest(path)
    assert (manifest["world_size"], manifest["iter"], manifest["optimizer_keys"]) == \
        (1, 3, ["exp_avg", "exp_avg_sq", "step"])
    assert manifest["dtypes"] == {n: "float32" for n in model.state_dict()}

    fresh, fresh_wrapper = _trained(steps=0, seed=1)
    restored = checkpointer.read(path, model=fresh, optim_wrapper=fresh_wrapper)
    assert restored["meta"]["iter"] == 3 and restored["meta"]["global_batch"] == 5
    checkpointer.apply(restored, path, model=fresh, optim_wrapper=fresh_wrapper)
    _assert_same_state(model, wrapper, fresh, fresh_wrapper)
    summary = describe_checkpoint(path)
    assert summary.complete and summary.iteration == 3 and summary.parameters == sum(
        t.numel() for t in model.state_dict().values())


def test_a_checkpoint_without_its_manifest_is_incomplete_and_skipped_by_name(tmp_path):
    model, wrapper = _trained()
    checkpointer = Checkpointer(tmp_path, io=PortableCheckpointIO())
    older = _save(checkpointer, model, wrapper, 3)
    newer = _save(checkpointer, model, wrapper, 6)
    (newer / MANIFEST_NAME).unlink()  # as a save killed before its last file
    problems = dict(checkpointer.candidates())
    assert f"portable checkpoint {str(newer)!r} is incomplete: it has no manifest.json" in \
        problems[newer]
    assert problems[older] is None and checkpointer.latest() == older
    assert not describe_checkpoint(newer).complete
    with pytest.raises(CheckpointError, match="is incomplete"):
        checkpointer.read(newer, model=model, optim_wrapper=wrapper)


def test_an_empty_directory_named_like_a_checkpoint_is_a_problem_not_a_crash(tmp_path):
    """No format recognises it: the portable IO says what it lacks."""
    model, wrapper = _trained()
    checkpointer = Checkpointer(tmp_path, io=PortableCheckpointIO())
    older = _save(checkpointer, model, wrapper, 3)
    empty = tmp_path / "iter_9.ckpt"
    empty.mkdir()
    problems = dict(checkpointer.candidates())
    assert "it has no manifest.json" in problems[empty]
    assert checkpointer.latest() == older


def test_a_one_file_checkpoint_restores_through_any_strategys_state_access(tmp_path):
    """A single-device/DDP ``.pth`` numbers its optimizer's parameters; under a strategy
    that writes another format it is renumbered by name and restored (here: torch's API)."""
    model, wrapper = _trained()
    path = _save(Checkpointer(tmp_path, io=FileCheckpointIO()), model, wrapper, 3)
    portable = Checkpointer(tmp_path, io=PortableCheckpointIO(),
                            restorers=[FileStateRestorer(TorchStateAccess())])
    assert portable.latest() == path
    fresh, fresh_wrapper = _trained(steps=0, seed=1)
    restored = portable.read(path, model=fresh, optim_wrapper=fresh_wrapper)
    assert set(restored["optimizer"]["state"]) == {n for n, _ in model.named_parameters()}
    portable.apply(restored, path, model=fresh, optim_wrapper=fresh_wrapper)
    _assert_same_state(model, wrapper, fresh, fresh_wrapper)


def test_positions_become_names_only_for_the_same_grouping():
    saved = {"state": {0: {"step": 1}, 2: {"step": 1}},
             "param_groups": [{"lr": 0.1, "params": [0, 1]}, {"lr": 0.2, "params": [2]}]}
    named = positions_to_names(saved, [["a.weight", "a.bias"], ["b.weight"]])
    assert named["state"] == {"a.weight": {"step": 1}, "b.weight": {"step": 1}}
    assert named["param_groups"][1] == {"lr": 0.2, "params": ["b.weight"]}
    with pytest.raises(ValueError, match=r"groups of \[2, 1\] parameters, this run's of \[3\]"):
        positions_to_names(saved, [["a.weight", "a.bias", "b.weight"]])


def test_positions_of_frozen_parameters_are_told_apart_by_the_models_order():
    """A DDP ``.pth`` numbered every parameter; ZeRO's groups hold the trained ones alone."""
    saved = {"state": {1: {"momentum_buffer": 1}, 2: {"momentum_buffer": 2}},
             "param_groups": [{"lr": 0.1, "params": [0, 1, 2]}]}
    every = ["stem.weight", "neck.weight", "head.weight"]
    named = positions_to_names(saved, [["neck.weight", "head.weight"]], every)
    assert named["state"] == {"neck.weight": {"momentum_buffer": 1},
                              "head.weight": {"momentum_buffer": 2}}
    assert named["param_groups"] == [{"lr": 0.1, "params": ["neck.weight", "head.weight"]}]
    with pytest.raises(ValueError, match=r"groups of \[3\] parameters, this run's of \[1\]"):
        positions_to_names(saved, [["head.weight"]], every[1:])
    with pytest.raises(ValueError, match="it trained 'neck.weight', which this run's model "
                                         "freezes"):
        positions_to_names(saved, [["head.weight"]], every)


def test_a_converter_writes_a_portable_checkpoint_and_reads_it_tensor_by_tensor(tmp_path):
    model, wrapper = _trained()
    optimizer = TorchStateAccess().optimizer_state(model, wrapper)
    path = write_portable(tmp_path / "out.ckpt", model.state_dict(), optimizer,
                          strategy="converted")
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert (manifest["strategy"], manifest["world_size"], manifest["plan"]) == \
        ("converted", 1, None)
    assert torch.equal(read_portable_tensor(path, "model.2.weight"), model[2].weight)
    assert torch.equal(read_portable_tensor(path, "optimizer.0.bias.exp_avg"),
                       optimizer["state"]["0.bias"]["exp_avg"])
    fresh, _ = _trained(steps=0, seed=1)
    loaded = PortableCheckpointIO().load_weights(path, fresh, held=PORTABLE_DIRECTORY,
                                                 on_read=lambda c: None)
    assert not loaded and torch.equal(fresh[0].weight, model[0].weight)
    with pytest.raises(CheckpointError, match="exists"):
        write_portable(path, model.state_dict())
    with pytest.raises(CheckpointError, match="holds no tensor 'model.nope'"):
        read_portable_tensor(path, "model.nope")


def _plan(strategy, steps):
    return {"strategy": strategy, "stages": [[name] for name, _, _ in steps],
            "steps": [{"name": n, "fn": fn, "params": params} for n, fn, params in steps]}


def test_the_plan_change_names_what_each_step_became():
    saved = _plan("deepspeed", [("setup_env", "ds:setup", {}), ("build_model", "m", {"a": 1}),
                                ("deepspeed_initialize", "ds:init", {}),
                                ("load_checkpoint", "l", {}), ("train", "t", {})])
    current = _plan("ddp", [("setup_env", "pg:setup", {}), ("load_checkpoint", "l", {}),
                            ("build_model", "m", {"a": 2}), ("wrap_model", "w", {}),
                            ("train", "t", {})])
    assert plan_changes(saved, current) == {
        "setup_env": "replaced", "load_checkpoint": "moved", "build_model": "moved",
        "wrap_model": "inserted", "deepspeed_initialize": "removed"}
    assert plan_changes(saved, saved) == {}


def test_staging_copies_once_into_buffers_the_next_save_reuses():
    """A background save's staged copy does not change with training, is one copy (DCP's
    writer takes it as staged), and the next save copies into the same buffers unless a
    tensor's shape changed."""
    from flexgraph.training.checkpoint._staging import StagedWriter, Staging

    staging = Staging()
    live = {"model": {"w": torch.ones(3), "b": torch.zeros(2)}, "optimizer": {}}
    first = staging.stage(live)
    live["model"]["w"].add_(1)  # training goes on
    assert torch.equal(first["model"]["w"], torch.ones(3))
    assert first["model"]["w"].data_ptr() != live["model"]["w"].data_ptr()
    assert StagedWriter("unused").stage(first) is first

    kept = first["model"]["w"].data_ptr()
    live["model"]["b"] = torch.zeros(4)  # another shape: a fresh buffer
    second = staging.stage(live)
    assert second["model"]["w"].data_ptr() == kept
    assert torch.equal(second["model"]["w"], torch.full((3,), 2.0))
    assert second["model"]["b"].shape == (4,)
    assert staging.stage({"model": {}}) == {"model": {}} and not staging._buffers


def test_a_background_save_holds_the_state_of_when_it_was_asked_for(tmp_path):
    model, wrapper = _trained()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    checkpointer = Checkpointer(tmp_path, io=PortableCheckpointIO(async_save=True))
    for iteration in (3, 4):  # the second save reuses the first one's staging buffers
        path = _save(checkpointer, model, wrapper, iteration)
        with torch.no_grad():
            for value in model.parameters():
                value.add_(1.0)  # while the background write goes on
        checkpointer.finish_pending()
        fresh, fresh_wrapper = _trained(steps=0, seed=1)
        checkpointer.apply(checkpointer.read(path, model=fresh, optim_wrapper=fresh_wrapper),
                           path, model=fresh, optim_wrapper=fresh_wrapper)
        for key, value in expected.items():
            assert torch.equal(fresh.state_dict()[key], value), (iteration, key)
        expected = {k: v.clone() for k, v in model.state_dict().items()}


def test_staging_a_dtensor_copies_its_shard_and_reuses_it():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from flexgraph.training.checkpoint._staging import Staging

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        live = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
        staging = Staging()
        first = staging.stage({"w": live})["w"]
        with torch.no_grad():
            live.add_(1)
        assert isinstance(first, DTensor) and torch.equal(first.to_local(), torch.ones(4, 2))
        second = staging.stage({"w": live})["w"]
        assert second is first and torch.equal(second.to_local(), torch.full((4, 2), 2.0))
    finally:
        dist.destroy_process_group()
