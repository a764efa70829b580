"""config.py in the work_dir: literal configs spelled directly, anything else by Config.dump."""

import keyword
import string

from hypothesis import example, given, settings
from hypothesis import strategies as st
from mmengine.config import Config

from flexgraph.training.config import WIDTH, config_text, write_config

_RESERVED = {"filename", "text", "pretty_text", "env_variables"}  # Config's own attributes
_names = st.text(string.ascii_lowercase, min_size=1, max_size=8).filter(
    lambda s: not keyword.iskeyword(s) and s not in _RESERVED)
_atoms = (st.none() | st.booleans() | st.integers() | st.text(max_size=12)
          | st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(
    _atoms,
    lambda inner: (st.lists(inner, max_size=4)
                   | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(_names, inner, max_size=4)
                   | st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_names, _values, min_size=1, max_size=5))
@example({"a": {"ª": None}})  # Python reads the identifier ª as a (NFKC)
def test_a_literal_config_reads_back_as_it_was(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cfg") / "config.py"
    write_config(Config(data), path)
    assert Config.fromfile(str(path)).to_dict() == Config(data).to_dict()


def test_the_spelling_is_mmengine_s_dict_call_and_fits_the_width(tmp_path):
    cfg = Config(dict(
        model=dict(type="Net", depth=4),
        param_scheduler=[dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0,
                              end=500), dict(type="CosineAnnealingLR", by_epoch=True)],
        env_cfg={"dist-cfg": dict(backend="gloo")},
        shape=(3,),
    ))
    text = config_text(cfg)
    assert text.startswith("model = dict(type='Net', depth=4)\n")
    assert "env_cfg = {'dist-cfg': dict(backend='gloo')}\n" in text
    assert "shape = (3,)\n" in text
    assert max(map(len, text.splitlines())) <= WIDTH
    path = tmp_path / "config.py"
    path.write_text(text)
    assert Config.fromfile(str(path)).to_dict() == cfg.to_dict()


class _NotALiteral:
    pass


def test_other_values_are_left_to_config_dump(tmp_path):
    for value in (float("nan"), _NotALiteral, {1: "int key"}):
        cfg = Config(dict(model=dict(type="Net"), odd=value))
        assert config_text(cfg) is None
    cfg = Config(dict(model=dict(type="Net"), sizes={1: 2}))
    write_config(cfg, tmp_path / "config.py")
    assert (tmp_path / "config.py").read_text() == cfg.pretty_text
