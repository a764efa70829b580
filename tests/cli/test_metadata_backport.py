"""Strategies are still found once the ``importlib_metadata`` backport is imported.

OpenMMLab packages import the backport (mmpretrain does), and configs pull them in
with ``custom_imports``. The backport installs its own distribution finder, after
which the standard library's ``entry_points()`` returns the backport's
``EntryPoint`` class; the registry must still load those entry points.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("importlib_metadata")


def test_the_backports_entry_points_are_what_entry_points_returns_once_imported():
    probe = textwrap.dedent("""
        import importlib_metadata
        from importlib.metadata import EntryPoint, entry_points
        found = list(entry_points(group="flexgraph.strategies"))
        print(all(not isinstance(ep, EntryPoint) for ep in found) and len(found) > 0)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "True", "the mechanism this file guards against is gone"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed", "single"])
def test_plan_finds_every_strategy_after_a_config_imports_the_backport(tmp_path, strategy):
    config = tmp_path / "cfg.py"
    config.write_text(textwrap.dedent("""
        custom_imports = dict(imports=['importlib_metadata'], allow_failed_imports=False)
        model = dict(type='torch.nn.Linear', in_features=2, out_features=1)
        optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
    """))
    done = subprocess.run(
        [sys.executable, "-m", "flexgraph", "plan", str(config), "--strategy", strategy],
        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "build_model" in done.stdout
