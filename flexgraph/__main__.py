"""``python -m flexgraph``: the same as the ``flexgraph`` command."""

import sys

from flexgraph.cli.main import main

if __name__ == "__main__":  # not when a forked rank's multiprocessing imports it
    sys.exit(main())
