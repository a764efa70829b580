"""The README stays a front page, and the plans the docs print are the plans flexgraph makes.

``README.rst`` is at most 250 lines and every page it links to exists. Every
``$ flexgraph plan ...`` command in a console block of the README and of
``docs/`` is run (from the repository root, as written) and must print what the
block shows after it, so a plan that changes (a renamed step, a moved module)
fails here, naming the page and line, instead of misleading a reader.
Commands that need torch (``--estimate``, ``--compare``, ``--strategy auto``)
are left to the estimate's own tests. The docs themselves (warnings as errors,
their doctests) are built by ``make docs``, which ``make test`` runs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.rst"
MAX_README_LINES = 250

# Commands that show a config of the reader's own, not a file of this repository.
ILLUSTRATIONS = {"cfg.py"}
NEEDS_TORCH = ("--estimate", "--compare", "auto")


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.rst has {len(lines)} lines; it is the front page (at most "
        f"{MAX_README_LINES}): move the detail into a page of docs/ and link it")


def test_the_readme_links_to_docs_pages_that_exist():
    targets = re.findall(r"<(docs/[^>]+)>`_", README.read_text(encoding="utf-8"))
    assert targets, "README.rst links to no page of docs/"
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert not missing, f"README.rst links to docs pages that do not exist: {missing}"


def _console_blocks(path: Path) -> list[tuple[int, list[str]]]:
    """(first line number, the block's lines dedented) of each console code block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != ".. code-block:: console":
            continue
        indent = len(line) - len(line.lstrip())
        body: list[tuple[int, str]] = []
        for j in range(i + 1, len(lines)):
            text = lines[j]
            if text.strip() and len(text) - len(text.lstrip()) <= indent:
                break
            body.append((j + 1, text))
        while body and not body[-1][1].strip():
            body.pop()
        content = [(n, t) for n, t in body]
        while content and not content[0][1].strip():
            content.pop(0)
        if not content:
            continue
        margin = min(len(t) - len(t.lstrip()) for _, t in content if t.strip())
        blocks.append((content[0][0], [t[margin:] for _, t in content]))
    return blocks


def _plan_examples() -> list[tuple[str, str, str]]:
    """(where, command, expected output) of each ``$ flexgraph plan`` with its output shown."""
    examples = []
    for path in [README, *sorted((ROOT / "docs").rglob("*.rst"))]:
        for first, block in _console_blocks(path):
            for k, line in enumerate(block):
                if not line.startswith("$ flexgraph plan "):
                    continue
                output = []
                for later in block[k + 1:]:
                    if later.startswith("$ "):
                        break
                    output.append(later)
                command = line[2:].split("#")[0].strip()
                words = shlex.split(command)
                if (words[2] in ILLUSTRATIONS or any(w in NEEDS_TORCH for w in words)
                        or not output):
                    continue
                where = f"{path.relative_to(ROOT)}:{first + k}"
                examples.append((where, command, "\n".join(output)))
    return examples


EXAMPLES = _plan_examples()


def test_the_docs_show_plans():
    # The README's plan and the guide's: if none were found, the parsing broke.
    assert len(EXAMPLES) >= 3, EXAMPLES


@pytest.mark.slow
@pytest.mark.parametrize(("where", "command", "expected"), EXAMPLES,
                         ids=[where for where, _, _ in EXAMPLES])
def test_a_documented_plan_is_what_flexgraph_prints(where, command, expected):
    words = shlex.split(command)
    assert (ROOT / words[2]).exists(), f"{where}: {words[2]} does not exist"
    done = subprocess.run([sys.executable, "-m", "flexgraph", *words[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    printed = "\n".join(line.rstrip() for line in (done.stdout + done.stderr).splitlines())
    shown = "\n".join(line.rstrip() for line in expected.splitlines())
    assert printed.strip("\n") == shown.strip("\n"), (
        f"{where}: `{command}` prints (exit {done.returncode}):\n{printed}\n\n"
        f"the docs show:\n{shown}")
