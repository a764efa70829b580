"""How much memory a rank has: ``--device-memory 80GB``, else the local device's.

The local device is the first GPU's total memory where CUDA is present, else
the machine's RAM (a CPU run's ranks share it: each gets its share). A size
given is a GPU's: the estimate is then for CUDA (:func:`target_device`).
"""

from __future__ import annotations

import os
import re

from flexgraph.training.errors import ConfigError

__all__ = ["DeviceMemoryError", "device_memory", "parse_size", "target_device"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class DeviceMemoryError(ConfigError):
    """``--device-memory`` is not a size (``80GB``, ``40GiB``, ``81920MiB``)."""


def parse_size(text: str) -> int:
    """``'80GB'`` -> 80e9 bytes; ``GiB`` and friends are powers of two.

    Parameters
    ----------
    text : str
        A size: a number and a unit (``B``, ``KB``, ``MB``, ``GB``, ``TB`` and
        ``KiB`` ... ``TiB``).

    Returns
    -------
    int
        Bytes.

    Raises
    ------
    DeviceMemoryError
        ``text`` is not a size.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise DeviceMemoryError(f"--device-memory {text!r} is not a size; write e.g. 80GB, "
                                f"40GiB or 81920MiB")
    return int(float(match.group(1)) * _UNITS[unit])


def device_memory(given: str | None, world_size: int) -> tuple[int, str]:
    """(bytes a rank has, where the figure comes from).

    Parameters
    ----------
    given : str or None
        ``--device-memory`` as written (``'80GB'``); ``None``: this machine's.
    world_size : int
        The ranks sharing this machine's RAM when there is no GPU.

    Returns
    -------
    tuple of (int, str)
        The bytes a rank has, and where the figure comes from.

    Raises
    ------
    DeviceMemoryError
        ``given`` is not a size.
    """
    if given:
        return parse_size(given), f"--device-memory {given}"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory, f"{props.name} total memory"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(world_size, 1), f"RAM / {world_size} ranks (no GPU)"


def target_device(given: str | None) -> str:
    """``'cuda'`` when the estimate is for GPUs, else ``'cpu'``.

    torch's default kernels differ between the two (the optimizer's step).

    Parameters
    ----------
    given : str or None
        ``--device-memory`` as written; a size means GPUs.

    Returns
    -------
    str
        ``'cuda'`` when a size is given or CUDA is here, else ``'cpu'``.
    """
    if given:
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
