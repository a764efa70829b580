"""Whether the files a run loads cover its model: decided from each file's own index.

Every format load_from reads (a torch.save zip, an MMEngine checkpoint, safetensors, a
DCP directory, a portable checkpoint), with ``load_from`` and with MMEngine's
``Pretrained`` (a prefix, a submodule), and files that leave entries out: then
``init_weights`` stays and the note names what is missing. "No tensor read" is checked
by damaging the tensors' bytes: the index still reads, the weights would not.
"""

from __future__ import annotations

import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import HistoryBuffer
from mmengine.model import BaseModel, BaseModule

from flexgraph.training.checkpoint import derive_from_weights, write_portable
from flexgraph.training.checkpoint._coverage import WeightSource, pretrained_sources
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import read_checkpoint_file, weights_index

PRUNES = ("init_weights",)


class Backbone(BaseModule):
    def __init__(self, init_cfg=None):
        super().__init__(init_cfg)
        self.fc = torch.nn.Linear(6, 4)
        self.norm = torch.nn.BatchNorm1d(4)


class Net(BaseModel):
    def __init__(self, backbone_init=None, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.backbone = Backbone(init_cfg=backbone_init)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, *args, **kwargs):  # not called: only names and shapes are read
        raise NotImplementedError


def weights() -> OrderedDict:
    torch.manual_seed(0)
    return Net().state_dict()


def cfg(**model) -> Config:
    return Config({"model": {"type": Net, **model}})


def derive(config: Config, load_from: str | None = None):
    return derive_from_weights(config, load_from, PRUNES)


def rewrites(derivation) -> list[str]:
    return [str(r) for r in derivation.rewrites]


def save_torch(path: Path, checkpoint) -> str:
    torch.save(checkpoint, path)
    return str(path)


def save_safetensors(path: Path, state) -> str:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return str(path)


def save_dcp(path: Path, state) -> str:
    import torch.distributed.checkpoint as dcp

    dcp.save({"state_dict": dict(state)}, checkpoint_id=str(path), no_dist=True)
    return str(path)


def mmengine_checkpoint(state) -> dict:
    """What MMEngine's CheckpointHook saves: meta, the weights, the message hub's buffers."""
    hub = {"log_scalars": {"train/loss": HistoryBuffer([1.0, 0.5], [1, 1])}, "runtime_info": {}}
    return {"meta": {"epoch": 2, "iter": 12, "seed": 0, "mmengine_version": "0.10.7"},
            "state_dict": state, "message_hub": hub,
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}}


@pytest.mark.parametrize("kind", ["raw state_dict", "flexgraph / MMEngine layout",
                                  "MMEngine checkpoint", "DDP's module. prefix", "model key",
                                  "safetensors", "DCP", "portable"])
def test_a_file_holding_every_entry_prunes_init_weights(tmp_path, kind):
    state = weights()
    path = tmp_path / "weights"
    made = {
        "raw state_dict": lambda: save_torch(path, state),
        "flexgraph / MMEngine layout": lambda: save_torch(path, {"state_dict": state,
                                                                 "meta": {}}),
        "MMEngine checkpoint": lambda: save_torch(path, mmengine_checkpoint(state)),
        "DDP's module. prefix": lambda: save_torch(path, {f"module.{k}": v
                                                          for k, v in state.items()}),
        "model key": lambda: save_torch(path, {"model": state}),
        "safetensors": lambda: save_safetensors(path, state),
        "DCP": lambda: save_dcp(path, state),
        "portable": lambda: str(write_portable(path, dict(state))),
    }[kind]()
    derivation = derive(cfg(), made)
    assert rewrites(derivation) == [
        f"prune init_weights (every state_dict entry comes from load_from {made!r})"]
    assert derivation.coverage.covered and not derivation.notes


def test_a_file_that_leaves_entries_out_keeps_init_weights_and_names_them(tmp_path):
    state = weights()
    del state["head.weight"], state["head.bias"]
    path = save_torch(tmp_path / "partial.pth", {"state_dict": state})
    derivation = derive(cfg(), path)
    assert derivation.rewrites == ()
    assert derivation.notes == {"init_weights": (
        f"kept: load_from {path!r} leaves 2 of 9 state_dict entries to init_weights: "
        "head.weight, head.bias")}


def test_an_entry_of_another_shape_is_not_covered(tmp_path):
    state = weights()
    state["head.weight"] = torch.zeros(5, 4)
    path = save_torch(tmp_path / "reshaped.pth", state)
    derivation = derive(cfg(), path)
    assert derivation.rewrites == ()
    assert "1 of 9 state_dict entries to init_weights (1 held under another shape): " \
           "head.weight" in derivation.notes["init_weights"]


def test_pretrained_with_a_prefix_on_a_submodule_covers_the_entries_under_it(tmp_path):
    full = weights()
    detector = {f"model.backbone.{k.removeprefix('backbone.')}": v for k, v in full.items()
                if k.startswith("backbone.")}
    path = save_torch(tmp_path / "detector.pth", {"state_dict": detector})
    init = dict(type="Pretrained", checkpoint=path, prefix="model.backbone")
    head_only = save_torch(tmp_path / "head.pth", {k: v for k, v in full.items()
                                                   if k.startswith("head.")})
    partial = derive(cfg(backbone_init=init))
    assert partial.rewrites == ()
    assert "head.weight, head.bias" in partial.notes["init_weights"]
    assert f"init_cfg Pretrained {path!r} of backbone (prefix 'model.backbone')" \
        in partial.notes["init_weights"]
    both = derive(cfg(backbone_init=init), head_only)
    assert rewrites(both)[0] == (
        f"prune init_weights (every state_dict entry comes from init_cfg Pretrained "
        f"{path!r} of backbone (prefix 'model.backbone') and load_from {head_only!r})")
    assert both.rewrites[1].params == {"pretrained": [
        {"path": path, "module": "backbone", "prefix": "model.backbone"}]}


def test_pretrained_on_the_model_covers_it_and_load_from_overrides_what_it_holds(tmp_path):
    full = save_torch(tmp_path / "full.pth", weights())
    derivation = derive(cfg(init_cfg=dict(type="Pretrained", checkpoint=full)))
    assert rewrites(derivation)[0] == (
        f"prune init_weights (every state_dict entry comes from init_cfg Pretrained {full!r})")
    assert derivation.rewrites[1].params == {"pretrained": [
        {"path": full, "module": "", "prefix": None}]}
    # load_from sets every entry last: the Pretrained file has nothing left to load
    again = save_torch(tmp_path / "again.pth", weights())
    derivation = derive(cfg(init_cfg=dict(type="Pretrained", checkpoint=full)), again)
    assert rewrites(derivation) == [
        f"prune init_weights (every state_dict entry comes from load_from {again!r})"]


def test_pretrained_loads_in_mmengines_order_children_first():
    model = Net(backbone_init=dict(type="Pretrained", checkpoint="b.pth"),
                init_cfg=dict(type="Pretrained", checkpoint="a.pth"))
    assert pretrained_sources(model) == [
        WeightSource("b.pth", "init_cfg Pretrained", "backbone"),
        WeightSource("a.pth", "init_cfg Pretrained", "")]


def test_files_without_a_readable_index_keep_init_weights(tmp_path):
    url = derive(cfg(backbone_init=dict(type="Pretrained", checkpoint="https://x/b.pth")))
    assert "is a URL, which MMEngine downloads when init_weights runs" in \
        url.notes["init_weights"]
    tag = tmp_path / "global_step1"
    tag.mkdir()
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    deepspeed = derive(cfg(), str(tag))
    assert deepspeed.rewrites == ()
    assert "whose weights cannot be listed without reading them" in \
        deepspeed.notes["init_weights"]


def test_nothing_is_looked_at_for_a_strategy_that_prunes_nothing(tmp_path):
    path = save_torch(tmp_path / "full.pth", weights())
    assert derive_from_weights(cfg(), path, ()).coverage is None
    assert derive(cfg()).coverage is None, "no file to load"


def test_the_index_reads_no_tensor(tmp_path):
    """Bytes of the tensors changed after the save: reading the weights fails (CRC), the
    index still lists them; a safetensors file cut after its header lists them too."""
    state = weights()
    path = tmp_path / "w.pth"
    torch.save(state, path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:  # the first tensor's record, in place
        record = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    name, extra = struct.unpack("<HH", data[record.header_offset + 26:record.header_offset + 30])
    start = record.header_offset + 30 + name + extra
    data[start:start + 16] = bytes(x ^ 0xFF for x in data[start:start + 16])
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC-32"):
        read_checkpoint_file(path)
    index = weights_index(path)
    assert index.weights["head.weight"] == ((3, 4), torch.float32)
    assert sorted(index.weights) == sorted(state)
    cut = Path(save_safetensors(tmp_path / "w.safetensors", state))
    header = 8 + int.from_bytes(cut.read_bytes()[:8], "little")
    cut.write_bytes(cut.read_bytes()[:header])
    assert weights_index(cut).weights["backbone.fc.weight"] == ((4, 6), torch.float32)
