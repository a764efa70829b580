"""The layer contracts of DESIGN.md hold, and no module imports itself round a circle.

An editable install maps ``strategies/`` to ``flexgraph.strategies`` with an
import hook that static analysis cannot follow, so the checks stage the
package the way a wheel installs it (``strategies/`` inside ``flexgraph/``):
``lint-imports`` runs on that copy with the contracts from pyproject.toml, and
grimp (import-linter's own import graph, imports inside functions included)
finds any circle.
"""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
