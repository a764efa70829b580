"""Each built-in strategy's names, in one table.

A strategy answers to four names: its registry name (``--strategy fsdp``, a
config's ``strategy=dict(type='fsdp')``, and the name plans attribute rewrites
to), MMEngine's type name for it (``FSDPStrategy``, so MMEngine configs plan
unchanged), its factory (the function both names build the strategy with) and
its memory model (the module ``flexgraph plan --estimate`` imports). They are
all read from here: each factory takes its :attr:`Strategy.name` and
:attr:`Strategy.memory_model` from its row, and the entry points of the group
``flexgraph.strategies`` in ``pyproject.toml``, through which the registry
finds every strategy, are :func:`entry_points` of this table
(``tests/strategies/test_names.py`` and ``tests/test_packaging.py`` hold them
equal). A third-party strategy declares entry points of its own in that group.

Examples
--------
>>> FSDP.alias, FSDP.memory_model
('FSDPStrategy', 'flexgraph.strategies.fsdp.memory')
>>> entry_points()["DDPStrategy"]
'flexgraph.strategies.ddp:ddp'
"""

from __future__ import annotations

import attrs

__all__ = ["BUILT_IN", "DDP", "DEEPSPEED", "FSDP", "SINGLE", "StrategyNames", "entry_points"]

PACKAGE = "flexgraph.strategies"


@attrs.frozen
class StrategyNames:
    """The names of one strategy.

    Parameters
    ----------
    name : str
        Its registry name: ``--strategy``, a config's ``strategy=dict(type=...)``,
        and the :attr:`Strategy.name` plans print.
    alias : str
        MMEngine's type name for the same strategy (``'DDPStrategy'``),
        registered beside ``name``.
    factory : str
        ``'module:function'``: the function building its
        :class:`~flexgraph.Strategy`, which both names point to.
    memory_model : str
        The module of its memory model (``candidate_options`` and
        ``estimate_memory``): its :attr:`Strategy.memory_model`.
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
"""The built-in strategies, in the order the documentation lists them."""


def entry_points() -> dict[str, str]:
    """The entry points of the group ``flexgraph.strategies`` the table declares.

    Returns
    -------
    dict of str to str
        Each name and each alias -> its factory (``'module:function'``), as
        ``pyproject.toml`` lists them.
    """
    return {key: row.factory for row in BUILT_IN for key in (row.name, row.alias)}
