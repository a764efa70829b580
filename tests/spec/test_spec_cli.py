"""The broken-spec table through the command line: ``python -m flexgraph plan FILE``.

Each must exit 2 with one line ``error: ...`` naming the culprit, print no
traceback, and leave the spec's folder exactly as it was (no half-written
files, no caches). All cases run at once, in parallel processes.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.spec.broken_specs import CASES, Case, write_case

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("flexgraph.cli.main") is None,
    reason="the CLI (flexgraph/cli/main.py) is not written yet",
)]

CLI_CASES = [case for case in CASES if not case.api_only]


class Outcome(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    before: list[str]
    after: list[str]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Run every case's CLI process in parallel; collect their results by case id."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    started = {}
    for case in CLI_CASES:
        folder = tmp_path_factory.mktemp("cli")
        path = write_case(case, folder)
        before = listing(folder)
        proc = subprocess.Popen(
            [sys.executable, "-m", "flexgraph", "plan", str(path)],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[case.id] = (proc, folder, before)
    results = {}
    for case_id, (proc, folder, before) in started.items():
        out, err = proc.communicate(timeout=300)
        results[case_id] = Outcome(proc.returncode, out, err, before, listing(folder))
    return results


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_the_cli_refuses_a_broken_spec_cleanly(case: Case, outcomes: dict[str, Outcome]) -> None:
    result = outcomes[case.id]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert case.target in lines[0]
    for fragment in case.fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert result.after == result.before, "the CLI wrote into the spec's folder"
