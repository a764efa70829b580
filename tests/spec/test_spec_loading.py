"""What each front end accepts, and how a Spec chooses its strategy."""

from __future__ import annotations

import textwrap
from pathlib import Path

import attrs
import pytest

from flexgraph import Executor, Graph, Step, Strategy, UnknownStrategyError
from flexgraph.spec import Spec, SpecConfigError, SpecScriptError, load_spec


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


YAML_STEPS = """\
steps:
  - {name: make, fn: "json:loads", requires: raw, provides: data}
  - {name: tidy, fn: "m:tidy", updates: data}
  - {name: check, fn: "m:check", updates: data}
  - {name: save, fn: "m:save", requires: data}
inputs: {raw: "[1, 2]"}
"""


def test_every_rewrite_kind_as_yaml_data(tmp_path: Path) -> None:
    path = write(tmp_path, "all.yml", YAML_STEPS + """\
strategies:
  everything:
    - {insert: {name: log, fn: "m:log", requires: data}, before: save}
    - {remove: check}
    - {replace: tidy, with: {fn: "m:tidy2", updates: data}}
    - {move: log, after: save}
    - {move: log, before: save}
    - {fuse: [tidy, log], into: tidy_and_log}
    - {fuse: [tidy_and_log, save], into: {name: finish, fn: "m:finish", requires: data}}
    - {configure: make, params: {strict: true}}
strategy: everything
""")
    plan = load_spec(path).plan()
    assert plan.order == ("make", "finish")
    assert [r.kind for r in plan.rewrites] == [
        "insert", "remove", "replace", "move", "move", "fuse", "fuse", "configure"
    ]
    assert plan.graph.by_name["finish"].fn == "m:finish"
    assert dict(plan.graph.by_name["make"].params) == {"strict": True}


def test_replace_keeps_the_old_name_unless_given_one(tmp_path: Path) -> None:
    path = write(tmp_path, "r.yaml", YAML_STEPS + """\
strategies:
  swap: [{replace: tidy, with: {fn: "m:tidy2", updates: data}}]
""")
    plan = load_spec(path).plan("swap")
    assert plan.graph.by_name["tidy"].fn == "m:tidy2"
    assert plan.rewrites[0].description == "replace tidy with m:tidy2"


def test_a_strategy_as_a_mapping_with_doc_and_world_size(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", YAML_STEPS + """\
strategies:
  tidy_last:
    doc: check before tidying
    world_size: many
    rewrites: [{move: tidy, after: check}]
""")
    strategy = load_spec(path).strategies["tidy_last"]
    assert strategy == Strategy(
        "tidy_last", strategy.rewrites, doc="check before tidying", world_size="many"
    )


def test_the_callers_strategy_overrides_the_specs_choice(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", YAML_STEPS + """\
strategies:
  a: [{move: tidy, after: check}]
  b: [{configure: save, params: {x: 1}}]
strategy: a
""")
    spec = load_spec(path)
    assert spec.strategy == "a"
    assert spec.plan().strategy == "a"
    assert spec.plan("b").strategy == "b"
    assert spec.plan({"type": "b"}).strategy == "b"
    assert spec.plan(Strategy("inline")).strategy == "inline"
    assert attrs.evolve(spec, strategy=None).plan().strategy is None


def test_no_choice_anywhere_plans_without_a_strategy(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "n.yaml", YAML_STEPS))
    assert spec.strategy is None and spec.strategies == {}
    plan = spec.plan()
    assert plan.strategy is None and plan.order == ("make", "tidy", "check", "save")


def test_yaml_inputs_become_graph_inputs_and_cfg_options_override_them(tmp_path: Path) -> None:
    path = write(tmp_path, "i.yaml", YAML_STEPS)
    spec = load_spec(path, cfg_options={"raw": "[3]", "extra.deep": 1})
    assert spec.graph.inputs == {"raw"}
    assert dict(spec.inputs) == {"raw": "[3]", "extra": {"deep": 1}}


def test_functions_next_to_the_spec_are_importable_when_running(tmp_path: Path) -> None:
    write(tmp_path, "nearby_fns_1.py", """\
        def double(x):
            return 2 * x
    """)
    path = write(tmp_path, "run.yaml", """\
        steps: [{name: double, fn: "nearby_fns_1:double", requires: x, provides: y}]
        inputs: {x: 21}
    """)
    spec = load_spec(path)
    assert Executor().run(spec.plan(), dict(spec.inputs)).context["y"] == 42


def test_a_python_script_with_a_pipeline_function_and_strategy_objects(tmp_path: Path) -> None:
    path = write(tmp_path, "script.py", """\
        from flexgraph import Graph, Move, Step, Strategy

        def pipeline():
            return Graph.of([Step("a", "m:a", provides="x"), Step("b", "m:b", updates="x"),
                             Step("c", "m:c", updates="x")])

        strategies = {"swap": [Move("c", before="b")]}
        strategy = Strategy("other", [Move("b", after="c")])
        inputs = {"unused": 1}

        if __name__ == "__main__":
            raise SystemExit("loading a spec must not run the script's main block")
    """)
    spec = load_spec(path)
    assert set(spec.strategies) == {"swap", "other"} and spec.strategy == "other"
    assert spec.plan().order == ("a", "c", "b")
    assert spec.plan("swap").order == ("a", "c", "b")
    assert spec.graph.inputs == {"unused"}


def test_a_python_script_may_build_the_whole_spec(tmp_path: Path) -> None:
    path = write(tmp_path, "whole.py", """\
        from flexgraph import Graph, Step
        from flexgraph.spec import Spec

        pipeline = Spec(Graph.of([Step("a", "m:a")]), strategy=None)
    """)
    spec = load_spec(path)
    assert isinstance(spec, Spec) and spec.source == path
    assert spec.plan().order == ("a",)


def test_a_py_file_without_pipeline_is_an_mmengine_config(tmp_path: Path) -> None:
    path = write(tmp_path, "cfg.py", """\
        model = dict(type="Net", depth=2)
        steps = [dict(name="build", fn="m:build", requires="cfg", provides="model")]
        strategy = dict(type="tweak")
        strategies = dict(tweak=[dict(configure="build", params=dict(seed=1))])
    """)
    spec = load_spec(path)
    assert spec.cfg.model.depth == 2
    assert spec.inputs["cfg"] is spec.cfg
    assert spec.graph.inputs == {"cfg"}
    assert spec.strategy == {"type": "tweak"}
    assert dict(spec.plan().graph.by_name["build"].params) == {"seed": 1}


def test_cfg_options_are_merged_mmengine_style(tmp_path: Path) -> None:
    path = write(tmp_path, "cfg.py", """\
        model = dict(type="Net", depth=2)
        steps = [dict(name="build", fn="m:build", requires="cfg", provides="model")]
    """)
    spec = load_spec(path, cfg_options={"model.depth": 5, "work_dir": "out"})
    assert spec.cfg.model.depth == 5 and spec.cfg.work_dir == "out"


def test_cfg_base_files_and_custom_imports_of_sibling_modules(tmp_path: Path) -> None:
    write(tmp_path, "sibling_module_cfg_1.py", "LOADED = True\n")
    write(tmp_path, "base.py", """\
        steps = [dict(name="make", fn="m:make", provides="x"),
                 dict(name="grow", fn="m:grow", updates="x")]
    """)
    path = write(tmp_path, "child.py", """\
        _base_ = ["base.py"]
        custom_imports = dict(imports=["sibling_module_cfg_1"], allow_failed_imports=False)
        custom_steps = [dict(name="trim", fn="m:trim", updates="x", before="grow")]
    """)
    spec = load_spec(path)
    assert spec.graph.names == ("make", "grow", "trim")
    assert spec.plan().order == ("make", "trim", "grow")
    import sibling_module_cfg_1  # imported by mmengine through custom_imports

    assert sibling_module_cfg_1.LOADED


def test_cfg_without_steps_uses_the_default_graph(tmp_path: Path) -> None:
    path = write(tmp_path, "cfg.py", """\
        epochs = 3
        custom_steps = [dict(name="report", fn="m:report", requires="model")]
    """)

    def default_graph(cfg: object) -> Graph:
        assert cfg.epochs == 3
        return Graph.of([Step("build", "m:build", requires="cfg", provides="model")])

    spec = load_spec(path, default_graph=default_graph)
    assert spec.graph.names == ("build", "report")
    assert spec.graph.inputs == {"cfg"}
    assert spec.plan().order == ("build", "report")


def test_the_spec_is_a_frozen_value(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "f.yaml", YAML_STEPS))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.strategy = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.inputs["raw"] = "changed"  # type: ignore[index]


def test_an_unknown_strategy_from_the_caller_does_not_blame_the_file(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "u.yaml", YAML_STEPS))
    with pytest.raises(UnknownStrategyError, match=r"^unknown strategy 'nope'"):
        spec.plan("nope")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [({"model.depth.x": 1}, "depth"), ({"steps.0.name": "x"}, "Index 0")],
)
def test_bad_cfg_options_name_the_file(tmp_path: Path, options: dict, fragment: str) -> None:
    path = write(tmp_path, "cfg.py", "model = dict(depth=2)\nsteps = []\n")
    with pytest.raises(SpecConfigError, match=rf"cfg.py: --cfg-options: .*{fragment}"):
        load_spec(path, cfg_options=options)


def test_a_script_calling_sys_exit_is_a_spec_error(tmp_path: Path) -> None:
    path = write(tmp_path, "quits.py", "import sys\npipeline = None\nsys.exit(3)\n")
    with pytest.raises(SpecScriptError, match=r"quits.py:3: running the script raised SystemExit"):
        load_spec(path)


@pytest.mark.parametrize(
    ("file", "module"), [("my_pipe_script.py", "my_pipe_script"), ("json.py", "__flexgraph_spec__")]
)
def test_functions_of_a_script_are_named_after_it(tmp_path: Path, file: str, module: str) -> None:
    path = write(tmp_path, file, """\
        import flexgraph

        @flexgraph.step(provides="x")
        def make():
            return 1

        pipeline = flexgraph.Graph.of([make])
    """)
    assert load_spec(path).graph.by_name["make"].fn_name == f"{module}:make"
