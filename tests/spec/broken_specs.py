"""The table of broken specs shared by the API and CLI tests.

Each case is a few small files written into a fresh folder, the file to load,
the error class it must raise, and fragments its message must contain (besides
the file's name, always required): the step, the field, the did-you-mean.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

from flexgraph import (
    AmbiguousOrderError,
    CycleError,
    DuplicateProducerError,
    DuplicateStepError,
    MissingInputError,
    RewriteDefinitionError,
    StepDefinitionError,
    UnknownStepError,
    UnknownStrategyError,
)
from flexgraph.spec import (
    SpecConfigError,
    SpecFieldError,
    SpecFormatError,
    SpecImportError,
    SpecMissingFieldError,
    SpecNoGraphError,
    SpecNotFoundError,
    SpecPipelineError,
    SpecScriptError,
    SpecSyntaxError,
    SpecTypeError,
    SpecValueError,
)


class Case(NamedTuple):
    id: str
    files: dict[str, str]
    target: str
    error: type[Exception]
    fragments: tuple[str, ...]
    api_only: bool = False  # the CLI passes a default graph, so the case does not apply


GOOD_STEPS = """\
steps:
  - {name: load, fn: "m:load", provides: text}
  - {name: tokenize, fn: "m:tokenize", requires: text, provides: tokens}
  - {name: lowercase, fn: "m:lower", updates: tokens}
"""


def yaml_case(id: str, body: str, error: type[Exception], *fragments: str) -> Case:
    return Case(id, {"bad.yaml": textwrap.dedent(body)}, "bad.yaml", error, fragments)


def with_strategy(rewrites: str) -> str:
    return GOOD_STEPS + "strategies:\n  fast:\n" + textwrap.indent(
        textwrap.dedent(rewrites), "    "
    ) + "strategy: fast\n"


def py_case(id: str, body: str, error: type[Exception], *fragments: str, **kw: bool) -> Case:
    return Case(id, {"pipe.py": textwrap.dedent(body)}, "pipe.py", error, fragments, **kw)


CFG_STEPS = """\
steps = [
    dict(name="load", fn="m:load", provides="text"),
    dict(name="tokenize", fn="m:tokenize", requires="text", provides="tokens"),
    dict(name="lowercase", fn="m:lower", updates="tokens"),
]
"""

CASES = [
    Case("missing file", {}, "nope.yaml", SpecNotFoundError, ("does not exist",)),
    Case("unknown suffix", {"spec.toml": "x = 1\n"}, "spec.toml", SpecFormatError, (".toml",)),
    yaml_case("yaml syntax", "steps:\n  - name: a\n    fn: [m:f\n", SpecSyntaxError,
              "YAML syntax error", "bad.yaml:4"),
    yaml_case("yaml duplicate key", "steps:\n  - name: a\n    name: b\n    fn: m:f\n",
              SpecSyntaxError, "duplicate key 'name'", "bad.yaml:3"),
    yaml_case("yaml python tag", "steps: !!python/object/apply:os.system [ls]\n",
              SpecSyntaxError, "bad.yaml:1"),
    yaml_case("empty file", "", SpecMissingFieldError, "empty", "'steps'"),
    yaml_case("top level is a list", "- steps\n", SpecTypeError, "expected a mapping"),
    yaml_case("unknown top-level key", "step: []\n", SpecFieldError,
              "unknown top-level key 'step'", "did you mean 'steps'"),
    yaml_case("no steps", "strategy: ddp\n", SpecMissingFieldError,
              "missing top-level key 'steps'"),
    yaml_case("steps not a list", "steps: {name: a}\n", SpecTypeError,
              "field 'steps' must be a list"),
    yaml_case("step not a mapping", "steps: [load]\n", SpecTypeError, "steps[0]",
              "expected a mapping, got a string"),
    yaml_case("unknown step field", GOOD_STEPS + "  - {name: count, fn: 'm:c', requries: tokens}\n",
              SpecFieldError, "steps[3] (count)", "'requries'", "did you mean 'requires'"),
    yaml_case("missing fn", "steps:\n  - {name: load, provides: text}\n",
              SpecMissingFieldError, "steps[0] (load)", "'fn'"),
    yaml_case("missing name", "steps:\n  - {fn: 'm:f'}\n", SpecMissingFieldError, "steps[0]",
              "'name'"),
    yaml_case("requires is a number", "steps:\n  - {name: a, fn: 'm:f', requires: 3}\n",
              SpecTypeError, "steps[0] (a)", "'requires'", "an int"),
    yaml_case("fn without a module", "steps:\n  - {name: a, fn: tokenize}\n", SpecValueError,
              "steps[0] (a)", "'fn'", "'tokenize'"),
    yaml_case("params not a mapping", "steps:\n  - {name: a, fn: 'm:f', params: [1]}\n",
              SpecTypeError, "steps[0] (a)", "'params'"),
    yaml_case("step name not an identifier", "steps:\n  - {name: two words, fn: 'm:f'}\n",
              StepDefinitionError, "steps[0] (two words)", "identifier"),
    yaml_case("artifact required and updated",
              "steps:\n  - {name: a, fn: 'm:f', requires: x, updates: x}\n",
              StepDefinitionError, "steps[0] (a)", "both requires and updates"),
    yaml_case("duplicate step names", GOOD_STEPS + "  - {name: load, fn: 'm:f'}\n",
              DuplicateStepError, "two steps are named 'load'"),
    yaml_case("unknown rewrite kind", with_strategy("- {mvoe: lowercase, after: load}\n"),
              SpecFieldError, "strategies.fast[0]", "did you mean 'move'"),
    yaml_case("two kinds in one rewrite",
              with_strategy("- {move: lowercase, remove: load, after: load}\n"),
              SpecFieldError, "strategies.fast[0]", "'move' and 'remove'"),
    yaml_case("unknown rewrite field", with_strategy("- {move: lowercase, aftr: load}\n"),
              SpecFieldError, "strategies.fast[0] (move)", "'aftr'", "did you mean 'after'"),
    yaml_case("move with after and before",
              with_strategy("- {move: lowercase, after: load, before: tokenize}\n"),
              RewriteDefinitionError, "strategies.fast[0] (move)", "not both"),
    yaml_case("insert without an anchor",
              with_strategy("- insert: {name: x, fn: 'm:x'}\n"),
              RewriteDefinitionError, "strategies.fast[0] (insert)", "after= or before="),
    yaml_case("insert step with a bad field",
              with_strategy("- {insert: {name: x, fn: 'm:x', provide: y}, after: load}\n"),
              SpecFieldError, "strategies.fast[0] (insert) step 'x'", "'provide'",
              "did you mean 'provides'"),
    yaml_case("replace without with", with_strategy("- {replace: lowercase}\n"),
              SpecMissingFieldError, "strategies.fast[0] (replace)", "'with'"),
    yaml_case("fuse of one step", with_strategy("- {fuse: [load], into: both}\n"),
              RewriteDefinitionError, "strategies.fast[0] (fuse)", "at least two"),
    yaml_case("configure params not a mapping",
              with_strategy("- {configure: load, params: 3}\n"),
              SpecTypeError, "strategies.fast[0] (configure)", "'params'"),
    yaml_case("strategy is a number", GOOD_STEPS + "strategy: 3\n", SpecTypeError,
              "'strategy'"),
    yaml_case("strategies not a mapping", GOOD_STEPS + "strategies: [fast]\n", SpecTypeError,
              "'strategies'"),
    yaml_case("strategy mapping without rewrites",
              GOOD_STEPS + "strategies:\n  fast: {doc: quick}\n", SpecMissingFieldError,
              "strategies.fast", "'rewrites'"),
    yaml_case("unknown strategy chosen",
              with_strategy("- {move: lowercase, after: tokenize}\n").replace(
                  "strategy: fast", "strategy: fsat"),
              UnknownStrategyError, "field 'strategy'", "did you mean 'fast'"),
    yaml_case("rewrite of an unknown step", with_strategy("- {move: lowercse, after: load}\n"),
              UnknownStepError, "rewrite #1", "'lowercse'", "did you mean 'lowercase'"),
    yaml_case("cycle", "steps:\n  - {name: a, fn: 'm:a', after: b}\n"
              "  - {name: b, fn: 'm:b', after: a}\n", CycleError, "cycle: a -> b -> a"),
    yaml_case("missing input", GOOD_STEPS + "  - {name: count, fn: 'm:c', requires: token}\n",
              MissingInputError, "step 'count'", "'token'", "did you mean 'tokens'"),
    yaml_case("inputs not a mapping", GOOD_STEPS + "inputs: [text]\n", SpecTypeError,
              "'inputs'"),
    yaml_case("input also provided", GOOD_STEPS + "inputs: {text: hello}\n",
              DuplicateProducerError, "'text'", "'load'"),
    py_case("python syntax", "pipeline = (\n", SpecSyntaxError, "pipe.py:1", "syntax error"),
    py_case("python script raises", "import flexgraph\nx = 1\npipeline = 1 / 0\n",
            SpecScriptError, "pipe.py:3", "ZeroDivisionError"),
    py_case("pipeline of the wrong type", "pipeline = ['load']\n", SpecPipelineError,
            "'pipeline'", "a list"),
    py_case("pipeline needs arguments", "def pipeline(cfg):\n    pass\n", SpecPipelineError,
            "'pipeline'", "needs arguments"),
    py_case("python strategies of the wrong type",
            "from flexgraph import Graph\npipeline = Graph.of([])\nstrategies = ['fast']\n",
            SpecTypeError, "'strategies'"),
    py_case("python graph with a duplicate step",
            "from flexgraph import Graph, Step\n\n"
            "pipeline = Graph.of([Step('a', 'm:f'), Step('a', 'm:g')])\n",
            DuplicateStepError, "pipe.py:3", "two steps are named 'a'"),
    Case("cfg syntax", {"cfg.py": "steps = [\n"}, "cfg.py", SpecSyntaxError, ("cfg.py:1",)),
    Case("cfg base with a syntax error",
         {"base.py": "x = 1\ny = [\n", "cfg.py": "_base_ = ['base.py']\n" + CFG_STEPS},
         "cfg.py", SpecSyntaxError, ("in ", "base.py:2", "never closed")),
    Case("cfg base raises", {"base.py": "x = 1\ny = 1 / 0\n",
                             "cfg.py": "_base_ = ['base.py']\n" + CFG_STEPS},
         "cfg.py", SpecScriptError, ("base.py:2", "ZeroDivisionError")),
    Case("cfg missing _base_", {"cfg.py": "_base_ = ['missing_base.py']\n" + CFG_STEPS},
         "cfg.py", SpecConfigError, ("missing_base.py",)),
    Case("cfg custom_imports fails",
         {"cfg.py": "custom_imports = dict(imports=['no_such_module_xyz'])\n" + CFG_STEPS},
         "cfg.py", SpecImportError, ("custom_imports", "no_such_module_xyz")),
    Case("cfg raises", {"cfg.py": "x = 1\nsteps = undefined_name\n"}, "cfg.py",
         SpecScriptError, ("cfg.py:2", "NameError", "undefined_name")),
    Case("cfg without steps or default graph", {"cfg.py": "model = dict(type='M')\n"},
         "cfg.py", SpecNoGraphError, ("no 'steps'",), api_only=True),
    Case("cfg custom step of unknown order",
         {"cfg.py": CFG_STEPS + "custom_steps = [dict(name='strip', fn='m:s', "
          "updates='tokens')]\n"},
         "cfg.py", AmbiguousOrderError, ("custom_steps", "'strip' and 'lowercase'", "'tokens'")),
    Case("cfg custom step after a misspelled step",
         {"cfg.py": CFG_STEPS + "custom_steps = [dict(name='strip', fn='m:s', "
          "updates='tokens', after='lowercse')]\n"},
         "cfg.py", UnknownStepError, ("custom_steps", "step 'strip' says after='lowercse'",
                                      "no step named 'lowercse'", "did you mean 'lowercase'")),
    Case("cfg custom step with a bad field",
         {"cfg.py": CFG_STEPS + "custom_steps = [dict(name='strip', fn='m:s', update='tokens')]\n"},
         "cfg.py", SpecFieldError, ("custom_steps[0] (strip)", "did you mean 'updates'")),
    Case("cfg unknown strategy type",
         {"cfg.py": CFG_STEPS + "strategy = dict(type='NoSuchStrategy', stage=3)\n"},
         "cfg.py", UnknownStrategyError, ("field 'strategy'", "'NoSuchStrategy'")),
    Case("cfg step with a bad type",
         {"cfg.py": "steps = [dict(name='a', fn='m:f', after=[1])]\n"},
         "cfg.py", SpecTypeError, ("steps[0] (a)", "'after'")),
]


def write_case(case: Case, folder: Path) -> Path:
    for name, body in case.files.items():
        (folder / name).write_text(body, encoding="utf-8")
    return folder / case.target
