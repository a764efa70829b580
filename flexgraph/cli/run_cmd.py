"""``flexgraph run``: plan a config and execute it (written by the lead)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flexgraph run`` (filled in by the lead)."""
    parser.add_argument("config")


def run_command(args: argparse.Namespace) -> int:
    """Run the config; return the exit status."""
    raise NotImplementedError
