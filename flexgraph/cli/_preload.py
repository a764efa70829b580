"""Imported by a rank server started afresh (:mod:`flexgraph.cli.forked_ranks`): the ranks' modules.

Importing this module imports every module named in
:data:`~flexgraph.training.output.PRELOAD_VAR`, so that the ranks forked from the
server find them imported.
"""

import atexit
import os

from flexgraph.cli.forked_ranks import import_quietly
from flexgraph.training.output import PRELOAD_VAR

import_quietly(filter(None, os.environ.get(PRELOAD_VAR, "").split(",")))

# The server exits when its launcher does, with nothing to write or remove; tearing down
# the modules above would take another second, while it still holds the launcher's
# stdout (a reader of the launcher's output waits for it). The last handler runs first.
atexit.register(os._exit, 0)
