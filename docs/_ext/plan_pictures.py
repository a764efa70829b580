"""Plan pages drawn when the docs are built: ``flexgraph plan --format html``, embedded.

The directive ``flexgraph-plan`` runs the ``flexgraph plan`` of the interpreter
that builds the docs (``python -m flexgraph``, from the repository root), writes
the page it prints next to the built pages (``_plans/``) and embeds it at full
size, with a link to open it alone, so a picture is always the plan the code
makes today, never a stale image::

    .. flexgraph-plan:: examples/quickstart.py
       :strategy: fsdp
       :cfg-options: strategy.skip_init_weights=True
       :caption: The quickstart under FSDP

A plan that fails (a renamed example, an unknown strategy) fails the build at
the directive's line, with the command and its error. Planning imports no torch
and the page is drawn by flexgraph itself: no program beyond the docs' own
Python packages is needed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from html import escape
from pathlib import Path
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

PAGES = "_plans"
"""The folder of the built docs that holds the pages."""


def plan_page(root: Path, config: str, strategy: str | None, cfg_options: list[str]) -> str:
    """Return the page ``flexgraph plan CONFIG --format html`` prints.

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
        The HTML page.

    Raises
    ------
    ExtensionError
        ``flexgraph plan`` exited non-zero; the message holds its command and stderr.
    """
    command = [sys.executable, "-m", "flexgraph", "plan", config, "--format", "html"]
    if strategy:
        command += ["--strategy", strategy]
    if cfg_options:
        command += ["--cfg-options", *cfg_options]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        shown = " ".join(command[2:])
        raise ExtensionError(f"`python {shown}` exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class FlexgraphPlan(Directive):
    """``.. flexgraph-plan:: CONFIG``: the plan page of CONFIG, embedded at full size."""

    has_content = False
    required_arguments = 1
    option_spec: ClassVar = {
        "strategy": directives.unchanged,
        "cfg-options": directives.unchanged,
        "caption": directives.unchanged,
        "height": directives.positive_int,
    }

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        root = Path(env.app.confdir).parent
        config = self.arguments[0]
        env.note_dependency(str(root / config))
        strategy, options = self.options.get("strategy"), self.options.get("cfg-options", "")
        try:
            page = plan_page(root, config, strategy, options.split())
        except ExtensionError as error:  # an error at this directive's line fails the build
            raise self.error(str(error)) from None
        key = hashlib.sha256(f"{config} {strategy} {options}".encode()).hexdigest()[:8]
        name = f"{Path(config).stem}-{strategy or 'config'}-{key}.html"
        folder = Path(env.app.outdir) / PAGES
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(page, encoding="utf-8")
        src = "../" * env.docname.count("/") + f"{PAGES}/{name}"
        caption = self.options.get("caption", f"flexgraph plan {config}")
        title = f"flexgraph plan {config} --strategy {strategy or '(its own)'}"
        html = (f'<figure class="flexgraph-plan"><iframe src="{src}" title="{escape(title)}" '
                f'style="width:100%;height:{self.options.get("height", 720)}px;'
                'border:1px solid #ccc" loading="lazy"></iframe>'
                f'<figcaption><a href="{src}">open this page alone</a></figcaption></figure>')
        said = nodes.container(classes=["flexgraph-plan-caption"])
        self.state.nested_parse(StringList([caption], source=f"flexgraph plan {config}"),
                                self.content_offset, said)
        return [nodes.raw("", html, format="html"), *said.children]


def setup(app: Sphinx) -> dict[str, object]:
    """Register the ``flexgraph-plan`` directive."""
    app.add_directive("flexgraph-plan", FlexgraphPlan)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
