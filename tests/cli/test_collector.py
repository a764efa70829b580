"""The collector is kept off what loading imports, and on for the steps; left as found."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from flexgraph.cli import run_cmd
from flexgraph.cli.collector import imports_kept_from_collector
from flexgraph.cli.main import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
def test_paused_while_loading_then_imports_frozen_then_as_found(enabled):
    (gc.enable if enabled else gc.disable)()
    try:
        with imports_kept_from_collector() as imports_done:
            assert not gc.isenabled()
            imports_done()
            assert gc.isenabled() == enabled
            assert gc.get_freeze_count() > 0
        assert gc.isenabled() == enabled
        assert gc.get_freeze_count() == 0
        with pytest.raises(KeyError), imports_kept_from_collector():
            raise KeyError("loading failed")
        assert gc.isenabled() == enabled
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


class _Probe:
    """Executor hook: the collector's state when each step starts."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool]] = []

    def before_step(self, step, context) -> None:
        self.seen.append((gc.isenabled(), gc.get_freeze_count() > 0))

    def after_step(self, step, context, record) -> None:
        pass


def test_a_run_steps_with_the_collector_on_and_the_imports_frozen(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    argv = ["run", str(EXAMPLES / "textstats.yaml")]
    probe = _Probe()
    assert run_cmd._run(build_parser(argv).parse_args(argv), [probe]) == 0
    assert probe.seen and set(probe.seen) == {(True, True)}
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert "textstats" in sys.modules  # imported while loading, so frozen with the rest
