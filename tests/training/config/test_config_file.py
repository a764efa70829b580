"""config.py in the work_dir: literal configs spelled directly, anything else by Config.dump."""

import keyword
import os
import string

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mmengine.config import Config
from mmengine.config import config as mmengine_config

from flexgraph.training.config import config_text, write_config
from flexgraph.training.config._writer import WIDTH
from flexgraph.training.errors import ConfigError

_RESERVED = set(mmengine_config.RESERVED_KEYS)  # Config refuses them at the top level
_UNWRITABLE = _RESERVED | {mmengine_config.BASE_KEY, mmengine_config.DEPRECATION_KEY}
# Keys that broke, or could break, the spelling: NFKC (º -> o, ﬁ -> fi), not identifiers,
# keywords, __debug__, names that hide the builtins the file calls, MMEngine's templates.
_TRICKY = ["º", "ª", "ﬁ", "é", "a b", "", "0", "a-b", "class", "None", "True", "lambda",
           "match", "_", "__debug__", "dict", "globals", "_delete_", "_scope_", "filename",
           "{{ fileDirname }}", "{{$HOME:x}}", "{{_base_.a}}", "{{"]
_names = st.text(string.ascii_lowercase, min_size=1, max_size=8).filter(
    lambda s: not keyword.iskeyword(s) and s not in _RESERVED)
_keys = _names | st.sampled_from(_TRICKY) | st.text(max_size=5)
_atoms = (st.none() | st.booleans() | st.integers() | st.text(max_size=12)
          | st.sampled_from(_TRICKY) | st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(
    _atoms,
    lambda inner: (st.lists(inner, max_size=4)
                   | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(_names, inner, max_size=4)
                   | st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=12)
_top_keys = _keys.filter(lambda key: not key.startswith("__") and key not in _UNWRITABLE)


def _reads_back(cfg, folder):
    path = folder / "config.py"
    write_config(cfg, path)
    return Config.fromfile(str(path)).to_dict()


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_top_keys, _values, min_size=1, max_size=5))
@example({"a": {"ª": None}})  # Python reads the identifier ª as a (NFKC)
@example({"dict": 1, "model": {"type": "Net"}})  # `dict = 1` hid the builtin
@example({"m": {"__debug__": 1}})  # dict(__debug__=1) is a syntax error
@example({"m": {"{{ fileDirname }}": "{{$HOME:x}}"}})  # fromfile substituted them
def test_a_literal_config_reads_back_as_it_was(tmp_path_factory, data):
    assert _reads_back(Config(data), tmp_path_factory.mktemp("cfg")) == Config(data).to_dict()


def test_property_tests_draw_the_same_examples_unless_exploring():
    exploring = os.environ.get("HYPOTHESIS_PROFILE") == "explore"
    assert settings.default.derandomize is not exploring
    drawn = test_a_literal_config_reads_back_as_it_was._hypothesis_internal_use_settings
    assert drawn.derandomize is not exploring


def test_keys_that_are_not_ascii_identifiers_are_spelled_as_strings(tmp_path):
    nested = {"º": 1, "a b": [{"class": (None, [dict(x=[1, (2,)])])}], "None": (), "ok": 2}
    cfg = Config({
        "model": dict(type="Net", layers=[dict(kind="conv", args={"class": [1, [2, 3]]}),
                                          ({"º": "o"},)]),
        "mixed": nested,
        "º": [dict(a=[{"a b": ({"class": 1},)}])],
        "a b": 1,
        "class": nested,
        "é": "e",
        "{{ fileDirname }}": "{{$HOME:x}}",
    })
    text = config_text(cfg)
    assert text == (
        "model = dict(\n"
        "    type='Net',\n"
        "    layers=[dict(kind='conv', args={'class': [1, [2, 3]]}), ({'º': 'o'},)],\n"
        ")\n"
        "mixed = {\n"
        "    'º': 1,\n"
        "    'a b': [{'class': (None, [dict(x=[1, (2,)])])}],\n"
        "    'None': (),\n"
        "    'ok': 2,\n"
        "}\n"
        "globals()['º'] = [dict(a=[{'a b': ({'class': 1},)}])]\n"
        "globals()['a b'] = 1\n"
        "globals()['class'] = {\n"
        "    'º': 1,\n"
        "    'a b': [{'class': (None, [dict(x=[1, (2,)])])}],\n"
        "    'None': (),\n"
        "    'ok': 2,\n"
        "}\n"
        "globals()['é'] = 'e'\n"
        "globals()['\\x7b\\x7b fileDirname }}'] = '\\x7b\\x7b$HOME:x}}'\n"
    )
    assert max(map(len, text.splitlines())) <= WIDTH
    back = _reads_back(cfg, tmp_path)
    assert back == cfg.to_dict()
    assert list(back) == list(cfg.to_dict())  # in the config's own order


def test_a_top_level_dict_or_globals_key_does_not_hide_the_builtins(tmp_path):
    cfg = Config({"globals": 1, "dict": dict(a=1), "a b": dict(b=[dict(c=2)])})
    text = config_text(cfg)
    assert "globals = 1\ndict = {'a': 1}\n(lambda: None).__globals__['a b'] = " in text
    assert _reads_back(cfg, tmp_path) == cfg.to_dict()


@pytest.mark.parametrize("key", ["__x", "__debug__", *sorted(_UNWRITABLE)])
def test_a_top_level_key_no_config_file_holds_is_refused_by_name(tmp_path, key):
    cfg = Config(dict(model=dict(type="Net")))
    cfg.merge_from_dict({key: 1})  # as --cfg-options would
    with pytest.raises(ConfigError, match=f"top-level key '{key}'"):
        write_config(cfg, tmp_path / "config.py")
    assert not (tmp_path / "config.py").exists()


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


@pytest.mark.parametrize("key", ["a b", "class", "º", "dict"])
def test_config_dump_is_not_given_a_key_it_would_write_wrong(tmp_path, key):
    cfg = Config({"model": dict(type="Net"), key: 1, "odd": float("nan")})
    with pytest.raises(ConfigError, match=f"top-level key '{key}'"):
        write_config(cfg, tmp_path / "config.py")
    cfg = Config({"model": dict(type="Net"), "é": 1, "sizes": {1: 2}})
    assert _reads_back(cfg, tmp_path) == cfg.to_dict()  # é = ... reads back as é
    assert (tmp_path / "config.py").read_text() == cfg.pretty_text
