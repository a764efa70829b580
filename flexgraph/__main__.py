"""``python -m flexgraph``: the same as the ``flexgraph`` command."""

from flexgraph.cli.main import run_and_exit

if __name__ == "__main__":
    run_and_exit()
