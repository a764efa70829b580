"""``flexgraph plan --format html -o FILE``: the page, written only for a plan that is made,
without importing torch (the estimate's page imports it, as its table does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CONFIG = "model = dict(type='AnyModel')\nstrategy = dict(type='FSDPStrategy')\n"


def test_the_page_is_written_without_importing_torch(tmp_path):
    config, page = tmp_path / "cfg.py", tmp_path / "plan.html"
    config.write_text(CONFIG)
    code = ("import sys; from flexgraph.cli.main import main; "
            f"rc = main(['plan', {str(config)!r}, '--format', 'html', '-o', {str(page)!r}]); "
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["0", "False"], done.stderr
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "fsdp #5 inserted" in text


def test_a_plan_that_fails_writes_no_file(tmp_path):
    config, page = tmp_path / "cfg.py", tmp_path / "plan.html"
    config.write_text(CONFIG)
    done = subprocess.run([sys.executable, "-m", "flexgraph", "plan", str(config),
                           "--strategy", "fsdpp", "-f", "html", "-o", str(page)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown strategy 'fsdpp'" in done.stderr
    assert not page.exists()


def test_output_takes_every_format(tmp_path):
    config, out = tmp_path / "cfg.py", tmp_path / "plan.json"
    config.write_text(CONFIG)
    done = subprocess.run([sys.executable, "-m", "flexgraph", "plan", str(config),
                           "-f", "json", "-o", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == ""
    assert '"schema": "flexgraph.plan/1"' in out.read_text()
