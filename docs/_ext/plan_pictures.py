"""Plan pictures drawn when the docs are built: ``flexgraph plan --format dot``, shown by graphviz.

The directive ``flexgraph-plan`` runs the ``flexgraph plan`` of the interpreter
that builds the docs (``python -m flexgraph``, from the repository root) and
hands its dot text to :mod:`sphinx.ext.graphviz`, so a picture is always the
plan the code makes today, never a stale image::

    .. flexgraph-plan:: examples/quickstart.py
       :strategy: fsdp
       :cfg-options: strategy.skip_init_weights=True
       :caption: The quickstart under FSDP

A plan that fails (a renamed example, an unknown strategy) fails the build
at the directive's line, with the command and its error. Planning imports no
torch: each picture costs a fraction of a second.

Drawing needs Graphviz's ``dot`` (Debian's ``graphviz``). Where it is missing,
a developer's build shows each plan as its dot text instead, and says so once;
under CI (``CI`` set in the environment) a missing ``dot`` fails the build, so
the published pictures are never quietly left out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.ext.graphviz import Graphviz
from sphinx.util import logging

logger = logging.getLogger(__name__)


def plan_dot(root: Path, config: str, strategy: str | None, cfg_options: list[str]) -> str:
    """Return the dot text ``flexgraph plan CONFIG --format dot`` prints.

    Parameters
    ----------
    root : Path
        The repository root, where the config's path starts.
    config : str
        The config or spec to plan, relative to ``root``.
    strategy : str or None
        ``--strategy``; None keeps the one the config names.
    cfg_options : list of str
        ``--cfg-options`` items (``key=value``).

    Returns
    -------
    str
        The ``digraph`` text.

    Raises
    ------
    ExtensionError
        ``flexgraph plan`` exited non-zero; the message holds its command and stderr.
    """
    command = [sys.executable, "-m", "flexgraph", "plan", config, "--format", "dot"]
    if strategy:
        command += ["--strategy", strategy]
    if cfg_options:
        command += ["--cfg-options", *cfg_options]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        shown = " ".join(command[2:])
        raise ExtensionError(f"`python {shown}` exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class FlexgraphPlan(Graphviz):
    """``.. flexgraph-plan:: CONFIG``: the graphviz directive, its dot from ``flexgraph plan``."""

    has_content = False
    required_arguments = 1
    optional_arguments = 0
    option_spec: ClassVar = {
        **Graphviz.option_spec,
        "strategy": directives.unchanged,
        "cfg-options": directives.unchanged,
    }

    def run(self):
        root = Path(self.env.app.confdir).parent
        config = self.arguments[0]
        self.env.note_dependency(str(root / config))
        try:
            dot = plan_dot(root, config, self.options.get("strategy"),
                           self.options.get("cfg-options", "").split())
        except ExtensionError as error:  # an error at this directive's line fails the build
            raise self.error(str(error)) from None
        if shutil.which(self.config.graphviz_dot) is None:
            return self._without_dot(config, dot)
        self.arguments = []
        self.options.setdefault("alt", f"flexgraph plan {config} "
                                       f"--strategy {self.options.get('strategy', '(its own)')}")
        self.content = StringList(dot.splitlines(), source=f"flexgraph plan {config}")
        return super().run()

    def _without_dot(self, config: str, dot: str) -> list[nodes.Node]:
        """The plan as dot text, where Graphviz cannot draw it (never under CI)."""
        missing = (f"Graphviz's {self.config.graphviz_dot!r} is not installed "
                   "(apt-get install graphviz)")
        if os.environ.get("CI"):
            raise self.error(f"{missing}: the plan pictures cannot be drawn")
        if not getattr(self.env, "_flexgraph_plan_said_no_dot", False):
            logger.info("flexgraph-plan: %s; plans are shown as dot text", missing)
            self.env._flexgraph_plan_said_no_dot = True
        block = nodes.literal_block(dot, dot, language="text")
        caption = self.options.get("caption", f"flexgraph plan {config}")
        return [nodes.paragraph(text=f"{caption} (as dot text: {missing})"), block]


def setup(app: Sphinx) -> dict[str, object]:
    """Register the ``flexgraph-plan`` directive (graphviz must be loaded too)."""
    app.setup_extension("sphinx.ext.graphviz")
    app.add_directive("flexgraph-plan", FlexgraphPlan)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
