"""Imported by the rank server alone (:mod:`flexgraph.cli.forked_ranks`): the ranks' modules.

Importing this module imports every module named in
:data:`~flexgraph.cli.forked_ranks.PRELOAD_VAR`, so that the ranks forked from the
server find them imported. A module that fails here is left out: the rank imports it
again and reports the failure as usual.
"""

import contextlib
import importlib
import os

from flexgraph.cli.forked_ranks import PRELOAD_VAR

for _name in filter(None, os.environ.get(PRELOAD_VAR, "").split(",")):
    with contextlib.suppress(Exception):
        importlib.import_module(_name)
