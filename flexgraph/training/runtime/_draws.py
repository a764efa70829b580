"""The random draws a piece of code makes, noted as shapes and made again on another rank.

When one rank initialises the model for all, under ``randomness.diff_rank_seed``
each other rank's generator must still end setup where a DDP rank's would
(copying rank 0's would give every rank the same dropout masks). A generator's
advance depends on what was drawn, never on the values, so the draws are
replayed into scratch tensors.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import attrs
import numpy as np
import torch
from torch.utils._pytree import tree_map


@attrs.frozen
class TensorShape:
    """A tensor as a draw sees it: shape, strides, dtype and device type (no values)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device_type: str

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorShape:
        return cls(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
                   tensor.device.type)

    def scratch(self) -> torch.Tensor:
        """An uninitialised tensor like this one on this rank's device (the CPU for meta)."""
        device = {"meta": "cpu"}.get(self.device_type, self.device_type)
        if device == "cuda":
            device = f"cuda:{torch.cuda.current_device()}"
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)


@attrs.frozen
class Draw:
    """One random operation: the ATen overload's name and its arguments, tensors as shapes."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def make(self) -> None:
        """Draw again into scratch tensors: the default generator advances as it did."""
        scratch = {}

        def real(value: Any) -> Any:
            if isinstance(value, TensorShape):
                scratch[id(value)] = value.scratch()
                return scratch[id(value)]
            return value

        args, kwargs = tree_map(real, (self.args, self.kwargs))
        _overload(self.op)(*args, **kwargs)


@functools.cache
def _overload(name: str) -> Any:
    """``'aten::uniform_.default'`` -> ``torch.ops.aten.uniform_.default``."""
    namespace, _, rest = name.partition("::")
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _uses_default_generator(kwargs: dict[str, Any]) -> bool:
    generator = kwargs.get("generator")
    return generator is None or generator is torch.default_generator


def _draw_of(func: Any, args: Any, kwargs: dict[str, Any]) -> Draw:
    shapes = tree_map(lambda v: TensorShape.of(v) if isinstance(v, torch.Tensor) else v,
                      (tuple(args), dict(kwargs)))
    return Draw(f"{func._schema.name}.{func._overloadname}", *shapes)


VALUE_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)
"""The operations that hand a tensor's value to Python (``.item()``, ``bool()``)."""


def replay_draws(draws: list[Draw]) -> None:
    """Make ``draws`` again, in order, into scratch tensors (one alive at a time)."""
    for draw in draws:
        draw.make()


def host_generators_moved(before: dict[str, Any]) -> bool:
    """Whether Python's or numpy's global generator drew since ``before`` (a ``capture_rng``)."""
    np_now = np.random.get_state()
    np_before = before["numpy"]
    return (random.getstate() != before["python"]
            or int(np_now[2]) != np_before["pos"]
            or not np.array_equal(np_now[1].astype(np.int64), np_before["keys"].numpy()))


@attrs.frozen
class SourceDraws:
    """What the rank that initialised for all tells the others of its random draws;
    ``host_draws``: whether Python's or numpy's generator drew too (not replayed)."""

    draws: list[Draw]
    rng: dict[str, Any]
    host_draws: bool


def follow_source_draws(done: SourceDraws, *, diff_rank_seed: bool, warn: bool = True) -> None:
    """This rank's generators where a DDP rank's would be after the source's setup.

    Parameters
    ----------
    done : SourceDraws
        What the source recorded.
    diff_rank_seed : bool
    warn : bool, default True
        Warn when the source drew from Python's or numpy's generator (not replayed).
    """
    from flexgraph.training.runtime._rng import restore_rng

    if not diff_rank_seed:
        restore_rng(done.rng)
        return
    replay_draws(done.draws)
    if done.host_draws and warn:
        import warnings

        warnings.warn("init_weights drew from Python's or numpy's random generator on the rank "
                      "that initialised the model; under randomness.diff_rank_seed the other "
                      "ranks' generators of those were not advanced as a DDP run's would be",
                      stacklevel=2)
