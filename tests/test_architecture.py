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
import pytest
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _sources(*folders: str) -> dict[str, ast.Module]:
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
            for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))}


def _namespace_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names in ``function`` that hold a parsed command line: its parameters annotated
    ``argparse.Namespace``, and what it assigns from ``parse_args(...)``."""
    arguments = function.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
             if a.annotation is not None and "Namespace" in ast.unparse(a.annotation)}
    for node in ast.walk(function):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func).endswith("parse_args")):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_no_parsed_command_line_is_written_or_probed_for_undeclared_flags():
    """What the CLI derives from its arguments (the launcher chosen, ``--strategy auto``'s
    choice, SLURM's node rank, a requeued job's resume) travels as return values and
    fields of the run's context, never as attributes written into the argparse
    ``Namespace``; and the flags are read as the attributes the parser declares, never
    with ``getattr``, which would hide a flag that no parser declares."""
    found = []
    for name, tree in _sources("flexgraph/cli").items():
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            namespaces = _namespace_names(function)
            for node in ast.walk(function):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                           else [])
                for target in targets:
                    for part in ast.walk(target):
                        if (isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store)
                                and isinstance(part.value, ast.Name)
                                and part.value.id in namespaces):
                            found.append(f"{name}:{node.lineno} writes {ast.unparse(part)}")
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("setattr", "getattr", "vars") and node.args
                        and isinstance(node.args[0], ast.Name)
                        and node.args[0].id in namespaces):
                    found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_no_module_of_flexgraph_rebinds_a_global():
    """Run state is passed as arguments (the run's context); no function rebinds a
    module-level name for another module to read back."""
    found = [f"{name}:{node.lineno} global {', '.join(node.names)}"
             for name, tree in _sources("flexgraph", "strategies").items()
             for node in ast.walk(tree) if isinstance(node, ast.Global)]
    assert not found, "\n".join(found)


def test_every_variable_a_launcher_hands_its_ranks_is_named_in_one_module():
    """The launcher and its ranks import the ``FLEXGRAPH_*`` names from
    ``flexgraph.training.output._launch_env``; a name spelled anywhere else in the
    package is a second definition, which the two sides could disagree on."""
    home = "flexgraph/training/output/_launch_env.py"
    found = [f"{name}:{node.lineno} {node.value!r}"
             for name, tree in _sources("flexgraph", "strategies").items() if name != home
             for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.startswith("FLEXGRAPH_")]
    assert not found, "\n".join(found)
