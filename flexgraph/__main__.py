"""``python -m flexgraph``: the same as the ``flexgraph`` command."""

import sys

from flexgraph.cli.main import main

sys.exit(main())
