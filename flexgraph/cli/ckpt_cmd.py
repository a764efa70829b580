"""``flexgraph ckpt inspect`` and ``ckpt convert``: checkpoints, offline, on the CPU.

The reading and writing are :mod:`flexgraph.training.checkpoint_tools`'s; this prints them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.table import Table

from flexgraph.cli.console import print_renderable

FORMATS = ("text", "json")
TARGETS = ("torch", "safetensors", "dcp")  # flexgraph.training.checkpoint_tools.TARGETS, unimported

EPILOG = """\
examples:
  flexgraph ckpt inspect work_dirs/quickstart/epoch_20.pth
  flexgraph ckpt inspect work_dirs/run/iter_40.dcp --format json

exit status: 0 ok, 2 not a checkpoint or unreadable (one line on stderr)"""

CONVERT_EPILOG = """\
targets:
  torch        one consolidated torch.save file: weights, optimizer state and loop
               state where the source has them (for inference, sharing, MMEngine)
  safetensors  the model's weights only
  dcp          a torch.distributed.checkpoint directory (model, optimizer by name)

examples:
  flexgraph ckpt convert work_dirs/run/iter_40.dcp iter_40.pth
  flexgraph ckpt convert work_dirs/run/iter_40.ds model.safetensors --to safetensors
  flexgraph ckpt convert pretrained.safetensors pretrained.dcp --to dcp

exit status: 0 ok, 2 not a checkpoint, unreadable, or DST exists (one line on stderr)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    convert = commands.add_parser(
        "convert",
        help="rewrite a checkpoint in another format (torch, safetensors, dcp)",
        description="Rewrite a checkpoint of any format inspect reads in another format, "
                    "one tensor at a time, without building the model.",
        epilog=CONVERT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    convert.add_argument("source", metavar="SRC", help="a checkpoint file or directory")
    convert.add_argument("destination", metavar="DST", help="a path that does not exist yet")
    convert.add_argument("--to", choices=TARGETS, default="torch",
                         help="the format to write (default: torch)")
    convert.set_defaults(handler=convert_command)


def _count(number: int | None) -> str:
    return "-" if number is None else f"{number:,}"


def summary_table(summary: Any) -> Table:
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
    from flexgraph.training.checkpoint_tools import describe_checkpoint

    summary = describe_checkpoint(args.path)
    if args.format == "json":
        sys.stdout.write(json.dumps(summary.to_json(), indent=2) + "\n")
    else:
        print_renderable(summary_table(summary))
    return 0



def convert_command(args: argparse.Namespace) -> int:
    from flexgraph.training.checkpoint import human_bytes
    from flexgraph.training.checkpoint_tools import convert_checkpoint

    done = convert_checkpoint(args.source, args.destination, to=args.to)
    sys.stdout.write(f"converted {done.source} ({done.source_format}) to {done.destination} "
                     f"({done.target}): {done.tensors} tensors, the largest "
                     f"{human_bytes(done.largest_tensor_bytes)}\n")
    for line in done.left_out:
        sys.stdout.write(f"left out: {line}\n")
    return 0
