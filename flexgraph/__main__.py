"""``python -m flexgraph``: the same as the ``flexgraph`` command."""

from flexgraph.cli.main import run_and_exit

if __name__ == "__main__":  # not when a forked rank's multiprocessing imports it
    run_and_exit()
