"""One load path: ``load_from`` through the checkpointer's IO, formats told by content.

Single-process runs of the toy config; the sharded and engine IOs are exercised
by the FSDP and DeepSpeed CLI tests through the same ``load_checkpoint`` step.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO
from mmengine.model import BaseModule
from mmengine.model.weight_init import PretrainedInit
from mmengine.registry import WEIGHT_INITIALIZERS

from flexgraph.training.checkpoint import (
    Checkpointer,
    FileCheckpointIO,
    load_pretrained,
)
from flexgraph.training.errors import (
    CheckpointError,
    ForeignCheckpointError,
    UnsafeCheckpointError,
)
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    DEEPSPEED_DIRECTORY,
    TORCH_SAVE_FILE,
    format_of,
)
from flexgraph.training.loop import Hooks
from tests.training.training_helpers import Payload, run_steps


def _trained(make_cfg):
    return run_steps(make_cfg())["model"]


def _save_dcp(state_dict, path):
    """A DCP checkpoint as FSDP's IO writes it: the weights under ``state_dict``."""
    dcp.save({"state_dict": state_dict}, checkpoint_id=str(path))


def test_formats_are_told_by_content_never_by_name(tmp_path):
    weights = {"w": torch.ones(2)}
    named_like_a_dir = tmp_path / "epoch_1.dcp"
    torch.save(weights, named_like_a_dir)
    named_like_a_file = tmp_path / "epoch_2.pth"
    _save_dcp(weights, named_like_a_file)
    deepspeed_tag = tmp_path / "epoch_3.pth"
    deepspeed_tag.mkdir()
    torch.save({"module": weights}, deepspeed_tag / "mp_rank_00_model_states.pt")
    text = tmp_path / "notes.pth"
    text.write_text("not a checkpoint")

    assert format_of(named_like_a_dir) is TORCH_SAVE_FILE
    assert format_of(named_like_a_file) is DCP_DIRECTORY
    assert format_of(deepspeed_tag) is DEEPSPEED_DIRECTORY
    assert format_of(text) is None
    assert format_of(tmp_path / "absent") is None


def test_load_from_a_dcp_checkpoint_into_a_whole_model(tmp_path, make_cfg):
    trained = _trained(make_cfg)
    sharded = tmp_path / "weights.pth"  # a DCP directory whatever its name says
    _save_dcp(trained.state_dict(), sharded)
    fresh = run_steps(make_cfg(load_from=str(sharded)), last="wrap_model")["model"]
    for key, value in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_another_tools_format_is_read_by_its_own_reader_and_named_when_it_fails(
        tmp_path, make_cfg):
    """A DeepSpeed tag under a single device goes to DeepSpeed's reader (not refused),
    which names the directory and what is wrong in one line."""
    tag = tmp_path / "global_step10"
    tag.mkdir()
    torch.save({"module": {}}, tag / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError) as caught:
        run_steps(make_cfg(load_from=str(tag)), last="load_checkpoint")
    message = str(caught.value)
    assert "\n" not in message
    assert message == f"DeepSpeed checkpoint {str(tag)!r} has no module weights"


def test_after_load_checkpoint_sees_what_was_read_before_it_goes_in(tmp_path, make_cfg):
    trained = _trained(make_cfg)
    renamed = tmp_path / "renamed.pth"
    torch.save({"state_dict": {f"old.{k}": v for k, v in trained.state_dict().items()}},
               renamed)
    cfg = make_cfg(load_from=str(renamed))
    built = run_steps(cfg, last=("build_hooks", "build_checkpointer", "init_weights"))
    hooks: Hooks = built["hooks"]
    model, checkpointer = built["model"], built["checkpointer"]
    seen = []

    def after_load_checkpoint(checkpoint):  # a hook may still rewrite the keys, as in MMEngine
        seen.append(sorted(checkpoint["state_dict"])[0])
        checkpoint["state_dict"] = {k.removeprefix("old."): v
                                    for k, v in checkpoint["state_dict"].items()}

    loaded = checkpointer.load_weights(renamed, model, on_read=after_load_checkpoint)
    assert seen and seen[0].startswith("old.")
    assert loaded.missing == () and loaded.unexpected == ()
    for key, value in trained.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert isinstance(hooks, Hooks)


def test_resume_auto_refuses_another_strategys_newest_checkpoint(tmp_path, make_cfg):
    """Never skipped as if absent: resuming an older one would lose its progress."""
    run_steps(make_cfg())  # epoch_1..3.pth, written by the whole-model IO
    work = tmp_path / "work"
    newest = work / "epoch_4.dcp"
    _save_dcp(_trained(make_cfg).state_dict(), newest)
    (work / "last_checkpoint").write_text(str(newest))
    refused = (r"the newest checkpoint .*epoch_4.dcp' is a torch.distributed.checkpoint "
               r"directory \(.metadata\), which this strategy cannot restore")
    with pytest.raises(CheckpointError, match=refused):
        run_steps(make_cfg(resume="auto"), last="resume")


def test_resume_auto_under_another_io_sees_the_work_dir_is_not_empty(tmp_path, make_cfg):
    run_steps(make_cfg())
    checkpointer = Checkpointer(tmp_path / "work", io=DistributedCheckpointIO())
    found = checkpointer.candidates()
    assert [p.name for p, _ in found][0] == "epoch_3.pth"
    assert all(checkpointer.io.foreign_format(p) is TORCH_SAVE_FILE for p, _ in found)
    assert checkpointer.latest() is None, "none of them is a checkpoint this IO restores"


def test_damaged_checkpoints_are_still_skipped(tmp_path, make_cfg):
    run_steps(make_cfg())
    work = tmp_path / "work"
    (work / "epoch_4.pth").write_bytes(b"")  # a damaged file: no format at all
    shutil.copy(work / "epoch_3.pth", work / "epoch_2.pth")
    checkpointer = Checkpointer(work, io=FileCheckpointIO())
    problems = dict(checkpointer.candidates())
    assert "is empty" in problems[work / "epoch_4.pth"]
    assert checkpointer.io.foreign_format(work / "epoch_4.pth") is None


# -- init_cfg=dict(type='Pretrained'): a load like load_from ----------------------------------

class _Backbone(BaseModule):
    def __init__(self, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.body = torch.nn.Linear(4, 3)


class _Classifier(BaseModule):
    def __init__(self, classes=2, init_cfg=None, backbone_init=None):
        super().__init__(init_cfg=init_cfg)
        self.backbone = _Backbone(init_cfg=backbone_init)
        self.head = torch.nn.Linear(3, classes)


def _init(model):
    from flexgraph.training.components import initialise

    initialise(model, load_pretrained=load_pretrained)


def test_pretrained_with_a_prefix_loads_through_the_weight_loader(tmp_path):
    detector = _Classifier(classes=5)
    saved = tmp_path / "detector.pth"
    torch.save({"meta": {}, "state_dict": detector.state_dict()}, saved)
    model = _Classifier(backbone_init=dict(type="Pretrained", checkpoint=str(saved),
                                           prefix="backbone"))
    _init(model)
    assert torch.equal(model.backbone.body.weight, detector.backbone.body.weight)
    assert WEIGHT_INITIALIZERS.get("Pretrained") is PretrainedInit, "the registry is restored"


def test_pretrained_warns_of_a_head_of_another_shape_and_loads_the_rest(tmp_path, caplog):
    other = _Classifier(classes=7)
    saved = tmp_path / "other.pth"
    torch.save(other.state_dict(), saved)
    model = _Classifier(classes=2, init_cfg=dict(type="Pretrained", checkpoint=str(saved)))
    head_before = model.head.weight.detach().clone()
    _init(model)
    assert torch.equal(model.backbone.body.weight, other.backbone.body.weight)
    assert torch.equal(model.head.weight, head_before), "kept, as MMEngine keeps it"


def test_pretrained_refuses_a_malicious_pickle_and_a_damaged_file_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pth"
    torch.save({"state_dict": {}, "x": Payload(marker)}, evil)
    with pytest.raises(UnsafeCheckpointError):
        _init(_Classifier(init_cfg=dict(type="Pretrained", checkpoint=str(evil))))
    assert not marker.exists(), "MMEngine's loader would have run the payload"
    truncated = tmp_path / "cut.pth"
    torch.save(_Classifier().state_dict(), truncated)
    truncated.write_bytes(truncated.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"cut.pth' is truncated") as caught:
        _init(_Classifier(init_cfg=dict(type="Pretrained", checkpoint=str(truncated))))
    assert "\n" not in str(caught.value)
    saved = _saved_classifier(tmp_path)
    with pytest.raises(CheckpointError, match="has no weights under prefix 'neck.'"):
        _init(_Classifier(backbone_init=dict(type="Pretrained", checkpoint=str(saved),
                                             prefix="neck")))


def _saved_classifier(tmp_path):
    path = tmp_path / "classifier.pth"
    torch.save(_Classifier().state_dict(), path)
    return path


def test_resume_auto_refuses_a_ddp_checkpoint_under_fsdps_full_state_io(tmp_path, make_cfg):
    """Both write torch.save files, but a DDP file's optimizer state numbers the parameters
    and FSDP's full-state IO cannot place it (torch fails only at the next save): refused
    by name before training, never skipped for an older checkpoint."""
    run_steps(make_cfg())  # epoch_1..3.pth, written by the whole-model IO
    newest = tmp_path / "work" / "epoch_3.pth"
    refused = (rf"checkpoint '{newest}' is a single-device or DDP checkpoint: its optimizer "
               rf"state numbers the parameters, .* resume it with --strategy ddp, or start "
               rf"from its weights alone with --load-from '{newest}'")
    with pytest.raises(ForeignCheckpointError, match=refused):
        run_steps(make_cfg(resume="auto"), last="resume",
                  build_checkpointer={"io": "flexgraph.strategies.fsdp.checkpoint:FullStateFileIO"})


@pytest.mark.parametrize("strategy", [None, "ddp"], ids=["single", "ddp"])
def test_load_from_a_portable_checkpoint_under_a_strategy_writing_one_file(
        tmp_path, make_cfg, strategy):
    """Single device and DDP write ``.pth`` files; the portable reader loads ``load_from``
    of a portable directory (DDP's ranks, here one, read it through DCP together)."""
    from flexgraph.training.checkpoint import write_portable

    trained = _trained(make_cfg)
    path = write_portable(tmp_path / "iter_9.ckpt", trained.state_dict())
    cfg = make_cfg(load_from=str(path))
    if strategy is None:
        fresh = run_steps(cfg, last="load_checkpoint")["model"]
    else:
        fresh = _in_a_group_of_one(lambda: run_steps(
            cfg, strategy=strategy, last="load_checkpoint", setup_env={"device": "cpu"}))["model"]
    for key, value in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def _in_a_group_of_one(work):
    """``work()`` inside a one-rank gloo process group, destroyed afterwards."""
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        return work()
    finally:
        dist.destroy_process_group()


@pytest.fixture
def recognitions():
    """Each time any known format looks at a path (its key), while the test runs."""
    from flexgraph.training.formats import known_formats

    seen: list[str] = []
    originals = {f: f.recognise for f in known_formats()}
    for f, recognise in originals.items():
        object.__setattr__(f, "recognise", lambda path, f=f, recognise=recognise: (
            seen.append(f.key), recognise(path))[1])
    try:
        yield seen
    finally:
        for f, recognise in originals.items():
            object.__setattr__(f, "recognise", recognise)


@pytest.mark.parametrize("checkpoint_format", ["native", "portable"])
def test_load_from_and_resume_ask_once_what_a_path_holds(tmp_path, make_cfg, recognitions,
                                                         checkpoint_format):
    """The load asks the formats once and hands the answer down, through the portable IO
    to the one-file IO behind it; so does the restore, through read and apply."""
    from flexgraph.training import steps

    run_steps(make_cfg())  # epoch_1..3.pth
    last = tmp_path / "work" / "epoch_3.pth"
    options = {"checkpoint_format": checkpoint_format}
    built = run_steps(make_cfg(load_from=str(last)),
                      last=("build_hooks", "build_checkpointer", "init_weights"),
                      build_checkpointer=options)
    del recognitions[:]
    steps.load_checkpoint(built["settings"], built["run_context"], built["hooks"],
                          built["model"], built["checkpointer"])
    assert recognitions == ["torch"]
    built = run_steps(make_cfg(resume=str(last)), build_checkpointer=options,
                      last=("build_checkpointer", "build_hooks", "build_param_schedulers",
                            "build_dataloaders"))
    del recognitions[:]
    state = steps.resume(**{k: built[k] for k in (
        "settings", "run_context", "model", "optim_wrapper", "param_schedulers",
        "checkpointer", "hooks", "train_dataloader")})
    assert state.epoch == 3 and recognitions == ["torch"]
