"""Function references: checked without importing (plan), resolved all at once (run).

Each test writes its own small modules into a fresh folder on ``sys.path``; a
module that must not be imported raises (or records) at import time, so a
check that imported it would fail or leave a trace.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from flexgraph import Executor, Graph, Step, make_plan
from flexgraph.core.references import (
    ModuleImportError,
    NotCallableError,
    StepFunctionError,
    UnknownFunctionError,
    UnknownModuleError,
    check_reference,
    check_references,
    resolve_fn,
    resolve_functions,
    resolve_unchecked,
)


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``modules(name=source, ...)`` writes modules (``pkg/mod.py`` for packages) on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(**sources: str) -> Path:
        for name, source in sources.items():
            path = tmp_path / (name.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
            written.append(name.replace(".__init__", ""))
        return tmp_path

    yield write
    for name in written:
        sys.modules.pop(name, None)


STEPS = """
    import json
    from os.path import join as joined
    raise RuntimeError("importing this module is forbidden in a check")

    def freeze(model):
        return model

    class Freezer:
        def run(self):
            pass

    try:
        from fast_thing import thing
    except ImportError:
        def thing():
            pass

    RATE, (LOW, HIGH) = 0.1, (1, 2)
"""


@pytest.mark.parametrize(
    "ref", ["ck_steps:freeze", "ck_steps:Freezer", "ck_steps:Freezer.run", "ck_steps:thing",
            "ck_steps:joined", "ck_steps:json", "ck_steps:HIGH", "ck_steps.freeze"],
)
def test_a_name_bound_at_top_level_is_found_without_importing(modules, ref):
    modules(ck_steps=STEPS)
    assert check_reference(ref) is None
    assert "ck_steps" not in sys.modules


def test_a_misspelled_function_is_an_error_with_close_names(modules):
    modules(ck_steps=STEPS)
    with pytest.raises(UnknownFunctionError, match=r"'ck_steps' has no attribute 'freez' "
                                                   r"\(did you mean 'freeze'"):
        check_reference("ck_steps:freez")


def test_a_misspelled_module_suggests_its_siblings_without_running_the_package(modules):
    modules(**{"ck_pkg.__init__": "raise RuntimeError('never run')\n",
               "ck_pkg.training_steps": "def train():\n    pass\n"})
    assert check_reference("ck_pkg.training_steps:train") is None
    with pytest.raises(UnknownModuleError, match=r"no module named 'ck_pkg.trainng_steps' "
                                                 r"\(did you mean 'ck_pkg.training_steps'\?\)"):
        check_reference("ck_pkg.trainng_steps:train")
    assert "ck_pkg" not in sys.modules


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("from json import *\n", "has 'from json import *'"),
        ("def __getattr__(name):\n    return print\n", "defines __getattr__"),
        ("globals()['made'] = print\n", "calls globals()"),
        ("def _install():\n    global made\n    made = print\n\n_install()\n",
         "declares 'global made' in a function"),
        ("if (made := print):\n    pass\n", "binds 'made' with ':='"),
    ],
)
def test_what_the_source_cannot_settle_is_unchecked_with_the_reason(modules, source, reason):
    modules(ck_dynamic=source)
    assert reason in check_reference("ck_dynamic:made")


def test_a_namespace_package_has_no_source_to_read(modules):
    modules(**{"ck_space.inner": "def f():\n    pass\n"})  # a folder without __init__.py
    assert check_reference("ck_space.inner:f") is None
    assert "namespace package" in check_reference("ck_space:f")


def test_an_attribute_of_a_class_that_may_inherit_is_unchecked(modules):
    modules(ck_cls="class Base:\n    pass\n\nclass Child(Base):\n    pass\n")
    assert "only 'Child' was checked" in check_reference("ck_cls:Child.run")


def test_check_references_names_the_step_and_lists_the_unchecked(modules):
    modules(ck_steps=STEPS, ck_star="from json import *\n")
    good = Step("freeze", "ck_steps:freeze", provides="a")
    starred = Step("load", "ck_star:loads", requires="a", provides="b")
    unchecked = check_references(make_plan(Graph.of([good, starred])))
    assert [(u.where, u.ref) for u in unchecked] == [("step 'load'", "ck_star:loads")]
    wrong = Step("thaw", "ck_steps:thaw", requires="a")
    with pytest.raises(UnknownFunctionError, match="^step 'thaw': fn 'ck_steps:thaw'"):
        check_references(make_plan(Graph.of([good, wrong])))



def test_a_launcher_imports_only_what_the_check_left_open(modules):
    """``flexgraph run``'s launcher: checked modules are not imported, the unchecked are."""
    modules(ck_steps=STEPS, ck_star="from json import *\n", ck_star_typo="from json import *\n")
    good = Step("freeze", "ck_steps:freeze", provides="a")  # importing it raises
    starred = Step("load", "ck_star:loads", requires="a", provides="b")
    typo = Step("dump", "ck_star_typo:dumbs", requires="b")
    resolve_unchecked(check_references(make_plan(Graph.of([good, starred]))))
    assert "ck_star" in sys.modules and "ck_steps" not in sys.modules
    with pytest.raises(UnknownFunctionError, match="^step 'dump': fn 'ck_star_typo:dumbs'"):
        resolve_unchecked(check_references(make_plan(Graph.of([good, starred, typo]))))


# resolving -----------------------------------------------------------------------------


def test_resolving_tells_a_misspelled_module_from_a_broken_import_inside_it(modules):
    modules(ck_broken="import no_such_dependency_xyz\n\ndef f():\n    pass\n")
    with pytest.raises(UnknownModuleError, match=r"did you mean 'ck_broken'"):
        resolve_fn("ck_brokn:f")
    with pytest.raises(ModuleImportError, match="importing 'ck_broken' failed: .*"
                                                "no_such_dependency_xyz"):
        resolve_fn("ck_broken:f")


def test_resolving_refuses_what_cannot_be_called(modules):
    modules(ck_values="RATE = 0.1\n")
    with pytest.raises(NotCallableError, match="is a float"):
        resolve_fn("ck_values:RATE")


def test_the_executor_resolves_every_function_before_the_first_step_runs(modules, tmp_path):
    marker = tmp_path / "ran"
    modules(ck_run=f"def first():\n    open({str(marker)!r}, 'w').close()\n    return 1\n\n"
                   "def second(a):\n    pass\n")
    steps = [Step("first", "ck_run:first", provides="a"),
             Step("second", "ck_run:secnd", requires="a")]
    plan = make_plan(Graph.of(steps))
    with pytest.raises(StepFunctionError, match="step 'second'.*did you mean 'second'"):
        resolve_functions(plan)
    with pytest.raises(UnknownFunctionError):
        Executor().run(plan)
    assert not marker.exists(), "no step may run when a later one cannot be resolved"
