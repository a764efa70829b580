"""This process's RNGs, captured as plain tensors and numbers (``weights_only`` loads them)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from flexgraph.training.runtime._group import gathered_from_every_rank


def capture_rng() -> dict[str, Any]:
    """This process's python, numpy, torch and (if present) CUDA RNG states.

    Returns
    -------
    dict
    """
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` captured (CUDA only on the same devices).

    Parameters
    ----------
    state : dict
    """
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["gauss"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def gather_rng_states(mine: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order; a collective.

    Parameters
    ----------
    mine : dict, optional
        This rank's state; its current one by default.

    Returns
    -------
    list of dict
    """
    return gathered_from_every_rank(capture_rng() if mine is None else mine)
