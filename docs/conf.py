"""Sphinx configuration of flexgraph's documentation.

Built by ``make docs`` (HTML and the doctests, warnings as errors). The API
pages are autodoc over the package faces, so they list what each face's
``__all__`` lists; the plan pages are drawn when the docs are built, by
``_ext/plan_pictures.py`` running ``flexgraph plan --format html``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))

project = "flexgraph"
author = "the flexgraph authors"
copyright = "the flexgraph authors"
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "plan_pictures",
]

exclude_patterns = ["_build"]
root_doc = "index"
html_theme = "alabaster"
html_title = "flexgraph"
html_theme_options = {
    "description": "Training setup as a graph of named steps",
    "fixed_sidebar": True,
}

# The package's docstrings are numpydoc (Parameters / Returns / Raises / Examples).
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_class_signature = "separated"
# A method without a docstring of its own is an override (an MMEngine hook point,
# a CheckpointIO method): shown on its base, not again with the base's text.
autodoc_inherit_docstrings = False
autodoc_default_options = {"members": True, "show-inheritance": True}

# The faces re-export the objects of the modules behind them (flexgraph.Plan is
# flexgraph.core.plan.Plan), so an unqualified type in a docstring can name more
# than one documented object; either target is the same object.
suppress_warnings = ["ref.python"]

# The doctest builder runs the pages' own ``.. doctest::`` blocks. The ``>>>``
# examples of the docstrings (shown on the API pages) need their module's
# namespace: tests/test_docstring_examples.py runs those.
doctest_test_doctest_blocks = ""

# The doctests run from the repository root, as the examples' paths are written.
doctest_global_setup = f"""
import os
os.chdir({str(ROOT)!r})
"""
