"""Each built-in strategy's names, in one table, whose :func:`entry_points` are pyproject's."""

from __future__ import annotations

import attrs

__all__ = ["BUILT_IN", "DDP", "DEEPSPEED", "FSDP", "SINGLE", "StrategyNames", "entry_points"]

PACKAGE = "flexgraph.strategies"


@attrs.frozen
class StrategyNames:
    """The names of one strategy.

    Parameters
    ----------
    name, alias, factory, memory_model : str
        Its ``--strategy`` name, MMEngine's type name, ``'module:function'`` of its
        factory, and the module of its ``candidate_options`` and ``estimate_memory``.
    """

    name: str
    alias: str
    factory: str
    memory_model: str


SINGLE = StrategyNames("single", "SingleDeviceStrategy",
                       f"{PACKAGE}.single_device:single_device", f"{PACKAGE}.single_device_memory")
DDP = StrategyNames("ddp", "DDPStrategy", f"{PACKAGE}.ddp:ddp", f"{PACKAGE}.ddp_memory")
FSDP = StrategyNames("fsdp", "FSDPStrategy", f"{PACKAGE}.fsdp:fsdp", f"{PACKAGE}.fsdp.memory")
DEEPSPEED = StrategyNames("deepspeed", "DeepSpeedStrategy", f"{PACKAGE}.deepspeed:deepspeed",
                          f"{PACKAGE}.deepspeed.memory")

BUILT_IN = (SINGLE, DDP, FSDP, DEEPSPEED)


def entry_points() -> dict[str, str]:
    """The entry points of the group ``flexgraph.strategies``: name and alias -> factory.

    Returns
    -------
    dict of str to str
    """
    return {key: row.factory for row in BUILT_IN for key in (row.name, row.alias)}
