"""The examples in flexgraph's docstrings run and print what they say they print.

Every module under flexgraph/ and strategies/ whose source holds a ``>>>`` is
imported under its installed name and its examples are run with
:mod:`doctest`, so an example that drifts from the code fails here rather than
misleading a reader. Examples that cannot run in a test (they need files that
are not there) say ``# doctest: +SKIP``.
"""

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"flexgraph": "flexgraph", "strategies": "flexgraph.strategies"}


def _modules_with_examples() -> list[str]:
    names = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join((package, *parts)))
    return names


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in finder.find(module, name):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
