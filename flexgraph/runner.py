"""``flexgraph run`` from Python: :class:`Runner`, shaped like MMEngine's.

A ``tools/train.py`` written for ``Runner.from_cfg(cfg).train()`` runs
unchanged. Each call takes ``flexgraph run``'s own path with its flags at their
defaults, and starts no processes: under ``torchrun script.py`` each copy is a rank.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flexgraph.core.errors import FlexgraphError

if TYPE_CHECKING:
    from flexgraph.core.executor import RunResult

__all__ = ["Runner", "RunnerArgumentError"]


class RunnerArgumentError(FlexgraphError, TypeError):
    """A :class:`Runner` was given a config or a strategy of a kind it cannot run."""


def _check_cfg(runner: Runner, attribute: attrs.Attribute, value: Any) -> None:
    from mmengine.config import Config

    if not isinstance(value, (Config, Mapping, str, os.PathLike)):
        raise RunnerArgumentError(f"Runner's cfg must be an mmengine Config, a dict or the "
                                  f"path of a config, not {type(value).__name__}")


def _check_strategy(runner: Runner, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, Mapping) and "type" not in value:
        raise RunnerArgumentError(f"Runner's strategy {dict(value)!r} has no type; "
                                  "give dict(type='FSDPStrategy', ...) or a name")
    if value is not None and not isinstance(value, (str, Mapping)):
        raise RunnerArgumentError(f"Runner's strategy must be a name ('ddp', 'auto', ...) or "
                                  f"dict(type=..., **options), not {type(value).__name__}")


@attrs.frozen
class Runner:
    """Train, validate or test a config as ``flexgraph run`` does, from Python.

    ``cfg`` (a ``Config``, a dict, or a file ``flexgraph run`` takes) is copied,
    never changed; ``strategy`` (a name or ``dict(type=..., **options)``) replaces
    the config's own.

    Examples
    --------
    >>> from flexgraph.runner import Runner
    >>> Runner.from_cfg("examples/quickstart.py", strategy="fsdp").strategy
    'fsdp'
    """

    cfg: Any = attrs.field(validator=_check_cfg)
    strategy: str | Mapping[str, Any] | None = attrs.field(default=None,
                                                           validator=_check_strategy)

    @classmethod
    def from_cfg(cls, cfg: Any, strategy: str | Mapping[str, Any] | None = None) -> Runner:
        """The runner of ``cfg``, as MMEngine's ``Runner.from_cfg(cfg)``; nothing runs yet."""
        return cls(cfg, strategy)

    def train(self) -> RunResult:
        """Train (``flexgraph run``), validating as the config says; artifacts in ``context``."""
        return self._run("train")

    def val(self) -> RunResult:
        """One validation pass of ``load_from``'s weights; metrics in ``context["val_result"]``."""
        return self._run("val")

    def test(self) -> RunResult:
        """One test pass of ``load_from``'s weights; metrics in ``context["test_result"]``."""
        return self._run("test")

    def _run(self, entry: str) -> RunResult:
        from flexgraph.cli.collector import imports_kept_from_collector
        from flexgraph.cli.run_cmd import add_arguments, execute_run, prepare_run
        from flexgraph.training.output import LaunchEnv

        config = self._config()
        parser = argparse.ArgumentParser(prog="flexgraph run")
        add_arguments(parser)  # flexgraph run's flags, at their defaults but for these
        name = config if isinstance(config, (str, os.PathLike)) else config.filename
        argv = [str(name or "<config>"), f"--entry={entry}"]
        if isinstance(self.strategy, str):
            argv.append(f"--strategy={self.strategy}")
        args = parser.parse_args(argv)
        with imports_kept_from_collector() as imports_done:
            prepared = prepare_run(args, config, LaunchEnv(), None, imports_done)
            return execute_run(args, (), prepared)

    def _config(self) -> Any:
        from mmengine.config import Config

        cfg = self.cfg
        if isinstance(cfg, Mapping) and not isinstance(cfg, Config):
            cfg = Config(dict(cfg))
        if not isinstance(self.strategy, Mapping):
            return cfg
        if isinstance(cfg, (str, os.PathLike)):
            from flexgraph.cli.planning import load_config

            read = load_config(cfg).cfg
            if read is None:
                raise RunnerArgumentError(
                    f"{os.fspath(cfg)} is a pipeline, not a config: a strategy dict needs "
                    "a config; name the strategy instead (strategy='ddp')")
            cfg = read
        else:
            cfg = cfg.copy()
        cfg.strategy = dict(self.strategy)  # replaced whole, as --strategy auto's choice is
        return cfg
