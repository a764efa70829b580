"""``flexgraph``: the command line. ``main(argv) -> exit status``.

``run``'s module is imported only for ``run``, so ``plan`` and ``--help`` never
import torch. Exit status, the contract scripts rely on: ``0`` done; ``2`` bad
input (a usage error, a :class:`~flexgraph.FlexgraphError`, or a step failure
it caused); ``1`` anything else; ``75`` stopped on a signal after saving;
``130`` interrupted before training. An error is one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from flexgraph import __version__
from flexgraph.cli import ckpt_cmd, plan_cmd
from flexgraph.cli.errors import DEBUG_HINT, describe_error
from flexgraph.cli.stopping import report_stop
from flexgraph.training.errors import TrainingStopped

PLAN_EPILOG = """\
examples:
  flexgraph plan pipeline.yaml                   the plan as a table
  flexgraph plan cfg.py --strategy ddp --diff    what ddp changes, step by step
  flexgraph plan cfg.py --explain load_checkpoint
  flexgraph plan pipeline.yaml -f mermaid        paste into a GitHub comment

exit status: 0 ok, 2 bad input (one line on stderr), 1 anything else"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a short usage and the error, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        positionals = " ".join(a.metavar or a.dest for a in self._get_positional_actions()
                               if a.help is not argparse.SUPPRESS)
        print(f"usage: {self.prog} [options] {positionals} (--help lists the options)",
              file=sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _command_of(argv: Sequence[str]) -> str | None:
    return next((word for word in argv if not word.startswith("-")), None)


def _add_debug(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="on error, print the full traceback (chained causes included)",
    )


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser; ``run``'s flags (and module) only when ``argv`` runs it."""
    parser = _Parser(
        prog="flexgraph",
        description="Training setup as a graph of named steps that strategies rewrite.",
    )
    _add_debug(parser, False)
    parser.add_argument("--version", action="version", version=f"flexgraph {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    plan = commands.add_parser(
        "plan",
        help="print the plan a strategy makes of a config, without running it",
        description="Print the plan a strategy makes of a config, without running anything.",
        epilog=PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan_cmd.add_arguments(plan)
    _add_debug(plan, argparse.SUPPRESS)
    plan.set_defaults(handler=plan_cmd.plan_command)

    ckpt = commands.add_parser(
        "ckpt",
        help="look into checkpoints (inspect) and convert them, offline, without building "
             "the model",
        description="Look into checkpoints and convert them, offline, without building "
                    "the model.",
    )
    ckpt_cmd.add_arguments(ckpt)
    _add_debug(ckpt, argparse.SUPPRESS)

    run = commands.add_parser(
        "run",
        help="plan a config and execute it (single process or launched on many)",
        description="Plan a config and execute the plan.",
    )
    if _command_of(argv) == "run":
        from flexgraph.cli import run_cmd

        run_cmd.add_arguments(run)
        run.set_defaults(handler=run_cmd.run_command)
    _add_debug(run, argparse.SUPPRESS)
    return parser


def _report(exc: BaseException, debug: bool) -> int:
    status, message = describe_error(exc)
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"error: {message}", file=sys.stderr)
    if status == 1 and not debug:
        print(DEBUG_HINT, file=sys.stderr)
    return status


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (``| head``): stop quietly, as the docs advise."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError):
        os.dup2(devnull, sys.stdout.fileno())
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        try:
            args = build_parser(argv).parse_args(argv)
        except SystemExit as exit_:  # --help and --version (0), usage errors (2)
            return exit_.code if isinstance(exit_.code, int) else 2
        debug = args.debug
        handler: Callable[[argparse.Namespace], int | None] = args.handler
        return int(handler(args) or 0)
    except TrainingStopped as stop:
        return report_stop(stop)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except Exception as exc:
        return _report(exc, debug)


def run_and_exit() -> NoReturn:
    """The ``flexgraph`` command; a launcher skips the interpreter's teardown."""
    status = main()
    launch = sys.modules.get("flexgraph.cli.launch")
    if launch is not None and launch.is_launcher():
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":  # pragma: no cover
    run_and_exit()
