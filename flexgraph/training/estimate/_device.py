"""How much memory a rank has (``--device-memory``) and a node's host (``--host-memory``);
without a flag, the first GPU's, else a share of this machine's RAM."""

from __future__ import annotations

import os
import re

from flexgraph.training.errors import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, flag: str = "--device-memory") -> int:
    """A size with a decimal (``GB``) or binary (``GiB``) unit, in bytes; ``flag`` for errors."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ConfigError(f"{flag} {text!r} is not a size; write e.g. 80GB, "
                          f"40GiB or 81920MiB")
    return int(float(match.group(1)) * _UNITS[unit])


def _ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory(given: str | None, world_size: int) -> tuple[int, str]:
    """(bytes a rank has, where the figure comes from).

    Parameters
    ----------
    given : str or None
        ``--device-memory`` as written; ``None``: this machine's.
    world_size : int
        The ranks sharing this machine's RAM without a GPU.

    Returns
    -------
    tuple of (int, str)
    """
    if given:
        return parse_size(given), f"--device-memory {given}"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory, f"{props.name} total memory"
    return _ram() // max(world_size, 1), f"RAM / {world_size} ranks (no GPU)"


def host_memory(given: str | None) -> tuple[int, str]:
    """(bytes of one node's host memory, where the figure comes from).

    Parameters
    ----------
    given : str or None
        ``--host-memory`` as written; ``None``: this machine's RAM.

    Returns
    -------
    tuple of (int, str)
    """
    if given:
        return parse_size(given, "--host-memory"), f"--host-memory {given}"
    return _ram(), "this machine's RAM"


def target_device(given: str | None) -> str:
    """``'cuda'`` when the estimate is for GPUs (a size given, or CUDA here), else ``'cpu'``.

    Parameters
    ----------
    given : str or None
        ``--device-memory`` as written.

    Returns
    -------
    str
    """
    if given:
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
