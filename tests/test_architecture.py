"""The layer contracts of docs/design.rst hold, no module imports itself round a circle,
and no block of code is written twice.

An editable install maps ``strategies/`` to ``flexgraph.strategies`` with an
import hook that static analysis cannot follow, so the checks stage the
package the way a wheel installs it (``strategies/`` inside ``flexgraph/``):
``lint-imports`` runs on that copy with the contracts from pyproject.toml, and
grimp (import-linter's own import graph, imports inside functions included)
finds any circle. pylint's duplicate-code check reads the sources where they
are.
"""

import ast
import contextlib
import io
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import astroid
from pylint.checkers.symilar import Symilar

ROOT = Path(__file__).resolve().parents[1]

COPIED_LINES_BOUND = 6
"""No block of this many lines of code may appear in two places."""


def _stage(folder: Path) -> Path:
    """The package as a wheel lays it out, under ``folder``."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "flexgraph", folder / "flexgraph", ignore=ignore)
    shutil.copytree(ROOT / "strategies", folder / "flexgraph" / "strategies", ignore=ignore)
    return folder


def test_layer_contracts_hold(tmp_path):
    _stage(tmp_path)
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout


def test_no_import_circle_anywhere(tmp_path):
    probe = textwrap.dedent("""
        import grimp, networkx as nx
        graph = grimp.build_graph("flexgraph")
        edges = nx.DiGraph((m, d) for m in graph.modules
                           for d in graph.find_modules_directly_imported_by(m))
        for circle in nx.simple_cycles(edges):
            print(" -> ".join([*circle, circle[0]]))
    """)
    result = subprocess.run([sys.executable, "-c", probe], cwd=_stage(tmp_path),
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, check=True)
    assert result.stdout == "", f"import circles:\n{result.stdout}"


def _imported_modules(sources: Iterable[str]) -> set[str]:
    """Every module the sources import, with each package above it (``a``, ``a.b``, ``a.b.c``)."""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return {name.rsplit(".", depth)[0] for name in names for depth in range(name.count(".") + 1)}


def test_no_six_lines_of_code_are_copied():
    """pylint's duplicate-code check over flexgraph/ and strategies/ finds no block.

    pylint flags a block only when it is *longer* than min-similarity-lines, so
    catching six lines takes min-similarity-lines=5. As pylint does by default,
    imports, docstrings, comments and function signatures are left out before
    lines are compared, and a line with no code on it (a lone bracket) does not
    count: a package face importing what its modules define, prose restating a
    contract, and a step keeping the signature of the one it replaces are not
    code copied. ``# pylint: disable`` comments have no say here.

    The check needs no import resolved, so astroid is told to follow none of
    them: otherwise its inference spends seconds parsing torch.
    """
    sources = {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
               for path in sorted([*ROOT.glob("flexgraph/**/*.py"),
                                   *ROOT.glob("strategies/**/*.py")])}
    symilar = Symilar(min_lines=COPIED_LINES_BOUND - 1, ignore_comments=True,
                      ignore_docstrings=True, ignore_imports=True, ignore_signatures=True)
    not_followed = _imported_modules(sources.values()) - astroid.MANAGER.module_denylist
    astroid.MANAGER.module_denylist.update(not_followed)
    try:
        for name, source in sources.items():
            symilar.append_stream(name, io.StringIO(source))
    finally:
        astroid.MANAGER.module_denylist.difference_update(not_followed)
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        symilar.run()
    assert " similar lines in " not in report.getvalue(), (
        "blocks of code written twice ([start:end] counts lines from 0, end excluded):\n"
        + report.getvalue())
