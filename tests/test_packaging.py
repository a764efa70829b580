"""The wheel holds every package: installed (not editable), it plans and trains the quickstart.

``pyproject.toml`` lists its packages one by one (``strategies/`` installs as
``flexgraph.strategies``), so a new subpackage left off that list would work in
the editable checkout and be missing from the wheel. The wheel is built from a
copy of the sources and installed into a fresh venv; the venv sees the test
venv's third-party packages through a path entry (not a site directory, so the
editable checkout's import hook is not installed there), and runs from a folder
outside the checkout.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from flexgraph.strategies.names import entry_points

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _built_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv*", ".git", "__pycache__", "*.egg-info", "build", "dist", "work_dirs", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(source)], check=True,
                   capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("flexgraph-*.whl")
    return wheel


def test_the_installed_wheel_plans_and_trains_the_quickstart(tmp_path):
    wheel = _built_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as files:
        declared = configparser.ConfigParser(delimiters=("=",))
        declared.optionxform = str  # entry point names are case-sensitive (FSDPStrategy)
        (listed,) = [n for n in files.namelist() if n.endswith(".dist-info/entry_points.txt")]
        declared.read_string(files.read(listed).decode())
    assert dict(declared["flexgraph.strategies"]) == entry_points(), \
        "the wheel's strategy entry points are not strategies/names.py's table"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True).stdout
    (Path(site.strip()) / "third_party.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    site.strip(), str(wheel)], check=True, capture_output=True)
    work = tmp_path / "run"
    work.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import flexgraph, flexgraph.strategies.fsdp, "
         "flexgraph.training.checkpoint; print(flexgraph.__file__)"],
        cwd=work, capture_output=True, text=True, check=True).stdout
    assert where.startswith(site.strip()), f"flexgraph came from {where}, not the wheel"
    quickstart = ROOT / "examples" / "quickstart.py"
    shutil.copy(ROOT / "examples" / "digits.py", work)
    for strategy in ("fsdp", "deepspeed"):
        planned = subprocess.run([str(python), "-m", "flexgraph", "plan", str(quickstart),
                                  "--strategy", strategy], cwd=work, capture_output=True,
                                 text=True)
        assert planned.returncode == 0, planned.stderr
    trained = subprocess.run(
        [str(python), "-m", "flexgraph", "run", str(quickstart), "--work-dir", "out",
         "--cfg-options", "train_cfg.max_epochs=1", "visualizer=None"],
        cwd=work, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "train_result" in trained.stdout
