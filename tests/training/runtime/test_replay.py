"""A one-device setup recorded without values and made again part by part (``_replay.py``).

Every parameter and buffer comes out as a one-device build and ``init_weights``
make it, bit for bit, whether made all together or one at a time, and the
generators end where that run leaves them; what the recording cannot see is
named, and made whole.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from mmengine.model import BaseModule
from torch import nn

from flexgraph.training.checkpoint import load_pretrained
from flexgraph.training.components import initialise
from flexgraph.training.components._weight_init import record_one_device_setup
from flexgraph.training.runtime import ReplayError, record_setup
from flexgraph.training.runtime._draws import replay_draws


class ConvModule(nn.Module):
    """mmcv's ConvModule: its constructor initialises its child's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        nn.init.kaiming_normal_(self.conv.weight, nonlinearity="relu")
        nn.init.constant_(self.conv.bias, 0)


class Head(BaseModule):
    def __init__(self, init_cfg=None) -> None:
        super().__init__(init_cfg)
        self.fc = nn.Linear(6, 4)


class Net(BaseModule):
    """MMEngine's init_cfg, modules' reset_parameters, a constructor's initialiser, 0-d and
    data-made parameters, a random buffer, and an init_weights of its own that samples by
    rejection (torch's trunc_normal_), reads another parameter and branches on a value."""

    def __init__(self, head_init=None) -> None:
        super().__init__(init_cfg=[dict(type="TruncNormal", layer="Linear", std=0.02),
                                   dict(type="Kaiming", layer="Conv2d"),
                                   dict(type="Constant", layer="LayerNorm", val=1.0,
                                        bias=0.0)])
        self.a = nn.Linear(30, 70)
        self.norm = nn.LayerNorm(70)
        self.emb = nn.Embedding(10, 6, padding_idx=2)
        self.conv = ConvModule()
        self.bn = nn.BatchNorm1d(7)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.pos = nn.Parameter(torch.randn(1, 5, 6) * 0.02)
        self.token = nn.Parameter(torch.zeros(1, 1, 6))
        self.q = nn.Linear(6, 6)
        self.attn = nn.MultiheadAttention(6, 2)
        self.g = nn.Parameter(torch.empty(7, 7))
        self.head = Head(head_init)
        self.register_buffer("projection", torch.randn(4))

    def init_weights(self) -> None:
        super().init_weights()
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.orthogonal_(self.g)
        with torch.no_grad():
            self.q.weight.copy_(self.a.weight[:6, :6] * 2)
            self.q.bias.fill_(1.0 if self.a.bias.sum() > 0 else -1.0)


def _one_device(seed: int, build=Net, init=lambda m: m.init_weights()):
    torch.manual_seed(seed)
    model = build()
    init(model)
    return model, torch.get_rng_state()


def _assert_made(record, model) -> None:
    made = record.values([*record.params, *record.buffers])
    expected = dict(model.state_dict(keep_vars=True))
    for name, value in made.items():
        assert torch.equal(value, expected[name].detach()), name


def test_every_parameter_and_buffer_is_made_as_one_device_makes_it():
    model, end = _one_device(0)
    torch.manual_seed(0)
    _, record = record_setup(Net, lambda m: m.init_weights())
    assert torch.equal(torch.get_rng_state(), end), "the generator ends as one device's"
    _assert_made(record, model)
    for name in record.params:  # one at a time, as a rank makes one unit's worth
        assert torch.equal(record.values([name])[name], model.get_parameter(name).detach())
    assert torch.equal(torch.get_rng_state(), end), "making values leaves it there"
    assert record.initialised[:1] == ("",) and record.whole == ()


def test_a_pretrained_file_is_read_for_the_parameters_it_sets(tmp_path):
    torch.manual_seed(5)
    file = tmp_path / "head.pth"
    torch.save({"state_dict": {"fc.weight": torch.randn(4, 6), "fc.bias": torch.randn(4)}},
               file)
    head_init = dict(type="Pretrained", checkpoint=str(file))

    def init(m):
        initialise(m, load_pretrained=load_pretrained)

    model, end = _one_device(1, lambda: Net(head_init), init)
    torch.manual_seed(1)
    _, record = record_setup(lambda: Net(head_init), init)
    assert torch.equal(torch.get_rng_state(), end)
    _assert_made(record, model)
    assert torch.equal(record.values(["head.fc.bias"])["head.fc.bias"],
                       torch.load(file)["state_dict"]["fc.bias"])


def test_the_draws_advance_another_seed_as_its_own_setup_would():
    """Under diff_rank_seed each rank follows the recorded draws from its own seed."""
    torch.manual_seed(3)
    _, record = record_setup(Net, lambda m: m.init_weights())
    assert {d.op for d in record.drawn.draws} >= {"aten::uniform_.default",
                                                  "aten::normal_.default",
                                                  "aten::randn.default"}
    draws = pickle.loads(pickle.dumps(record.drawn.draws))  # as they travel to the others
    _, own = _one_device(4)
    torch.manual_seed(4)
    replay_draws(draws)
    assert torch.equal(torch.get_rng_state(), own)


class _Numpy(BaseModule):
    """An init_weights that writes through numpy: the recording cannot see it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def init_weights(self) -> None:
        self.fc.weight.data.numpy()[:] = torch.randn(3, 4).numpy()


class _WithNumpy(BaseModule):
    def __init__(self) -> None:
        super().__init__(init_cfg=dict(type="TruncNormal", layer="Linear", std=0.02))
        self.body = nn.Linear(5, 4)
        self.odd = _Numpy()
        self.tail = nn.Linear(3, 2)


class _NumpyConstructor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(3))
        self.w.data.numpy()[:] = 2.0
        self.fc = nn.Linear(3, 3)


@pytest.mark.parametrize(("build", "where"), [(_WithNumpy, "odd"), (_NumpyConstructor, "")])
def test_what_the_recording_cannot_see_is_named_then_made_whole(build, where):
    model, end = _one_device(2, build, initialise)
    torch.manual_seed(2)
    with pytest.raises(ReplayError) as failed:
        record_setup(build, initialise)
    assert failed.value.module == where
    torch.manual_seed(2)
    record = record_one_device_setup({"model": {"type": build}}, None)
    assert record.whole == (where,)
    assert torch.equal(torch.get_rng_state(), end)
    _assert_made(record, model)
    if where:  # the rest is still recorded: only the odd module holds real parameters
        assert type(record.params["odd.fc.weight"]).__name__ == "Held"
        assert type(record.params["body.weight"]).__name__ == "View"


def test_a_tensor_read_then_changed_cannot_be_made_again():
    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.ones(3))
            self.w = nn.Parameter(torch.empty(3))
            with torch.no_grad():
                self.w.copy_(self.table)
            self.table.add_(1)

    _, record = record_setup(Reads, lambda m: None)
    with pytest.raises(ReplayError, match="changed after the read"):
        record.values(["w"])


def test_a_draw_from_a_generator_of_its_own_is_refused():
    class Own(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.empty(3))
            nn.init.normal_(self.w, generator=torch.Generator().manual_seed(0))

    with pytest.raises(ReplayError) as failed:
        record_setup(Own, lambda m: None)
    assert failed.value.module == ""


def test_a_portable_record_makes_what_needs_no_held_tensor_and_the_turns_agree():
    model, _ = _one_device(6)
    torch.manual_seed(6)
    _, record = record_setup(Net, lambda m: m.init_weights())
    copy = pickle.loads(pickle.dumps(record.portable()))  # as it travels to the others
    runs = [[name] for name in record.params]
    held = [run for run in runs if copy.reads_held(run)]
    assert ["token"] in held and ["scale"] in held, "made from data: the recording rank's"
    assert ["a.weight"] not in held
    for run in runs:
        if run not in held:
            assert torch.equal(copy.values(run)[run[0]], model.get_parameter(run[0]).detach())
    with pytest.raises(ReplayError, match="held by the rank that recorded it"):
        copy.values(["token"])
    for rank, mine in ((0, record), (1, copy), (2, copy)):
        turns = list(mine.made_in_turn(runs, source=0, rank=rank, world=3))
        assert [maker for maker, _ in turns] == [
            0 if run in held else i % 3 for i, run in enumerate(runs)]
        for run, (maker, made) in zip(runs, turns, strict=True):
            assert (made is not None) == (maker == rank)
            if made is not None:
                assert torch.equal(made[run[0]], model.get_parameter(run[0]).detach())
