"""The layer contracts of DESIGN.md hold (import-linter, on the installed layout).

An editable install maps ``strategies/`` to ``flexgraph.strategies`` with an
import hook that static analysis cannot follow, so the check stages the package
the way a wheel installs it (``strategies/`` inside ``flexgraph/``) and runs
``lint-imports`` on that copy with the contracts from pyproject.toml.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_layer_contracts_hold(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "flexgraph", tmp_path / "flexgraph", ignore=ignore)
    shutil.copytree(ROOT / "strategies", tmp_path / "flexgraph" / "strategies", ignore=ignore)
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout
