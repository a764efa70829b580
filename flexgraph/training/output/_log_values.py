"""The value a log line shows for each key: MMEngine's ``LogProcessor`` statistics.

The statistics are MMEngine's own ``HistoryBuffer`` methods over the same values,
so each equals the Runner's bit for bit; each key keeps only the tail a window
can reach, extended once per flush. ``LogProcessor`` itself is not imported:
``mmengine.runner`` imports DeepSpeed wherever it is installed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mmengine.logging import HistoryBuffer

from flexgraph.training.config import LogProcessorPolicy

_HUB_LIMIT = 1_000_000  # MMEngine's HistoryBuffer max_length: the most a window reaches


def _reach(policy: LogProcessorPolicy, epoch_length: int, by_epoch_loop: bool) -> int:
    """How many of a key's latest values any statistic of ``policy`` can use."""
    reach = policy.window_size
    for entry in policy.custom_cfg:
        window = entry.get("window_size")
        if entry["method_name"] == "current":
            continue
        if isinstance(window, int):
            reach = max(reach, window)
        elif window == "epoch" and by_epoch_loop and epoch_length:
            reach = max(reach, epoch_length)
        else:  # 'global', a whole-history statistic, or an iteration loop's 'epoch'
            return _HUB_LIMIT
    return reach


class LogValues:
    """Each logged key's recent values, and the statistics a log line shows of them.

    ``policy`` is the config's ``log_processor``; ``epoch_length`` and
    ``by_epoch_loop`` say how far an ``'epoch'`` window can reach.
    """

    def __init__(self, policy: LogProcessorPolicy, *, epoch_length: int = 0,
                 by_epoch_loop: bool = True) -> None:
        self.policy = policy
        self._pattern = re.compile(policy.mean_pattern)
        self._reach = _reach(policy, epoch_length, by_epoch_loop)
        self._history: dict[str, list[float]] = {}
        self._hub_lengths: dict[str, int] = {}

    def watch(self, hub: Any) -> None:
        """Note the hub's scalars now: of the others' ``train/`` scalars, only those
        that grow from here on (written during this run) are logged."""
        self._hub_lengths = {key: len(buffer.data[0])
                             for key, buffer in hub.log_scalars.items()}

    def extend(self, key: str, values: list[float]) -> None:
        """``values`` logged for ``key`` by the iterations since the last call."""
        history = self._history.get(key)
        if history is None:
            history = self._history[key] = []
        history.extend(values)
        if len(history) > 2 * self._reach:
            del history[:-self._reach]

    def own(self, values: Mapping[str, float]) -> list[str]:
        """The keys of ``values`` that this object keeps (not the hub's others)."""
        return [key for key in values if key in self._history]

    def train(self, hub: Any, *, epoch_window: int, global_window: int) -> dict[str, float]:
        """The values of a training log line: MMEngine's ``LogProcessor`` tag (without
        its ``epoch`` and ``iter``), keys without their ``train/`` prefix; the windows
        are what MMEngine makes of the window sizes ``'epoch'`` and ``'global'``."""
        scalars = hub.log_scalars
        others = {}
        for key, buffer in scalars.items():  # the others' train scalars written this run
            if (key.startswith("train") and key.removeprefix("train/") not in self._history
                    and len(buffer.data[0]) != self._hub_lengths.get(key, 0)):
                others[key.removeprefix("train/")] = buffer
        reach = self._reach
        buffers = {key: HistoryBuffer(values[-reach:], [1] * min(len(values), reach))
                   for key, values in self._history.items() if values}
        buffers.update(others)
        return self._statistics(buffers, epoch_window, global_window)

    def evaluation(self, hub: Any, mode: str, *, epoch_window: int,
                   global_window: int) -> dict[str, float]:
        """The scalars of an evaluation's line (``mode``: ``'val'`` or ``'test'``), from
        the hub's ``val/`` (``test/``) scalars, one value per evaluation, as the
        Runner computes them."""
        buffers = {key.removeprefix(f"{mode}/"): buffer
                   for key, buffer in hub.log_scalars.items() if key.startswith(mode)}
        return self._statistics(buffers, epoch_window, global_window)

    def _statistics(self, buffers: Mapping[str, HistoryBuffer], epoch_window: int,
                    global_window: int) -> dict[str, float]:
        """MMEngine's ``LogProcessor._collect_scalars`` over ``buffers``."""
        window = self.policy.window_size
        values = {key: float(buffer.mean(window) if self._pattern.search(key)
                             else buffer.current())
                  for key, buffer in buffers.items()}
        for entry in self.policy.custom_cfg:
            options = dict(entry)
            source = options.pop("data_src")
            name = options.pop("log_name", source)
            if options.get("window_size") == "epoch":
                options["window_size"] = epoch_window
            elif options.get("window_size") == "global":
                options["window_size"] = global_window
            if source in buffers:
                values[name] = float(buffers[source].statistics(**options))
        return values

    def scalars(self, values: Mapping[str, float], mode: str) -> dict[str, float]:
        """``values`` as the visualizer's backends get them: with their ``mode/`` prefix
        when ``log_with_hierarchy`` says so."""
        if not self.policy.log_with_hierarchy:
            return dict(values)
        return {f"{mode}/{key}": value for key, value in values.items()}
