"""``flexgraph ckpt inspect PATH``: what a checkpoint holds, offline, on the CPU.

The reading is the training layer's
(:func:`flexgraph.training.checkpoint.describe_checkpoint`: every format
flexgraph writes, MMEngine's files and plain ``state_dict`` files, plus the
formats strategies add, DeepSpeed's directories among them); this module only
prints it: a two-column table (rich), or ``--format json`` (the summary's
fields, one JSON object). No model is built and no tensor is loaded whole.

A path in no known format, or one that cannot be read, is an error naming the
path and the formats tried (exit 2, one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.table import Table

from flexgraph.cli.console import print_renderable

FORMATS = ("text", "json")

EPILOG = """\
examples:
  flexgraph ckpt inspect work_dirs/quickstart/epoch_20.pth
  flexgraph ckpt inspect work_dirs/run/iter_40.dcp --format json

exit status: 0 ok, 2 not a checkpoint or unreadable (one line on stderr)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``ckpt``'s subcommands (``inspect``) to ``parser``."""
    commands = parser.add_subparsers(dest="ckpt_command", metavar="COMMAND", required=True)
    inspect = commands.add_parser(
        "inspect",
        help="say what a checkpoint holds (format, step, parameters, state inside)",
        description="Say what a checkpoint holds, without building the model or loading "
                    "its tensors.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect.add_argument("path", help="a checkpoint file or directory")
    inspect.add_argument("--format", "-f", choices=FORMATS, default="text",
                         help="text (a table, default) or json (one object)")
    inspect.set_defaults(handler=inspect_command)


def _count(number: int | None) -> str:
    return "-" if number is None else f"{number:,}"


def summary_table(summary: Any) -> Table:
    """The summary as a two-column rich table (field, value).

    Parameters
    ----------
    summary : CheckpointSummary

    Returns
    -------
    rich.table.Table
    """
    table = Table(title=f"checkpoint {summary.path}", title_justify="left", show_header=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value")
    step = (f"epoch {_count(summary.epoch)}, iteration {_count(summary.iteration)}"
            if summary.epoch is not None or summary.iteration is not None else "-")
    rows = [
        ("format", summary.format),
        ("written by", summary.writer),
        ("complete", "yes" if summary.complete else f"no: {summary.problem}"),
        ("world size", _count(summary.world_size)),
        ("step", step),
        ("parameters", _count(summary.parameters)),
        ("dtypes", ", ".join(f"{d} ({n:,})" for d, n in summary.dtypes.items()) or "-"),
        ("state inside", ", ".join(summary.contents) or "-"),
        ("hook extras", ", ".join(summary.extras) or "-"),
        ("versions", ", ".join(f"{k.removesuffix('_version')} {v}"
                               for k, v in summary.versions.items()) or "-"),
    ]
    for field, value in rows:
        table.add_row(field, value)
    return table


def inspect_command(args: argparse.Namespace) -> int:
    """Run ``flexgraph ckpt inspect``; return the exit status (errors propagate to main)."""
    from flexgraph.training.checkpoint import describe_checkpoint

    summary = describe_checkpoint(args.path)
    if args.format == "json":
        sys.stdout.write(json.dumps(summary.to_json(), indent=2) + "\n")
    else:
        print_renderable(summary_table(summary))
    return 0
