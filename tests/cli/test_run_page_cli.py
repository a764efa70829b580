"""What a run leaves in its folder besides the log: ``timings.txt`` (every step of every
rank, each peak a high-water mark) and ``plan.html`` (the plan, measured beside estimated).

The page's rendering in a browser, 2 processes, is in tests/browser."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli.cli_helpers import QUICKSTART, ROOT

pytestmark = pytest.mark.slow


def _rows(table: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in table.splitlines()[3:]
            if line.strip() and not line.startswith("total")}


def test_a_run_writes_every_steps_timings_and_the_page_beside_its_estimate(tmp_path):
    done = subprocess.run([sys.executable, "-m", "flexgraph", "run", str(QUICKSTART),
                           "--work-dir", str(tmp_path / "work"), "--estimate",
                           "--cfg-options", "train_cfg.max_epochs=1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "work").iterdir() if (p / "plan.json").exists()]
    rows = _rows((run / "timings.txt").read_text())
    order = ["setup_env", "build_model", "init_weights", "build_hooks", "build_checkpointer",
             "load_checkpoint", "wrap_model", "build_dataloaders", "build_optim_wrapper",
             "build_param_schedulers", "build_train_step", "resume", "train"]
    assert list(rows) == order
    for step, cells in rows.items():
        rss, peak = float(cells[-2]), float(cells[-1])
        assert peak >= rss, step
    page = (run / "plan.html").read_text()
    assert "estimated: host" in page and "rank 0: peak host" in page
    assert 'id="memory-train"' in page


def test_a_pipeline_prints_every_step_it_ran(tmp_path):
    done = subprocess.run([sys.executable, "-m", "flexgraph", "run",
                           str(ROOT / "examples" / "textstats.yaml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("step timings"):done.stdout.index("summary:")]
    assert list(_rows(table)) == ["load_text", "tokenize", "lowercase", "fold_accents",
                                  "drop_stopwords", "strip_punctuation", "count_words",
                                  "top_words", "report"]
