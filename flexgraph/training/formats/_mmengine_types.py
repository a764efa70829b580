"""The few types MMEngine's checkpoints pickle, admitted to ``weights_only`` loads and no more.

A user migrating a half-trained MMEngine run hands flexgraph a file written by
``Runner.save_checkpoint``. Next to tensors and plain containers it holds:

* ``message_hub``: :class:`mmengine.logging.HistoryBuffer` objects, each with
  two numpy arrays and its statistics methods (pickled as
  ``getattr(HistoryBuffer, 'mean')`` and so on), and numpy scalars in
  ``runtime_info`` (the ETA);
* ``param_schedulers``: the schedulers' raw ``state_dict()`` (with
  ``collections.Counter`` milestones, which torch allows by default);
* ``meta``: ``epoch`` and ``iter`` as completed counts, and ``seed``; no RNG
  state and no position inside an epoch.

``torch.load(weights_only=True)`` refuses the first group. :func:`allow_mmengine_types`
admits exactly the globals listed in :func:`mmengine_globals`, for one load:

* ``HistoryBuffer`` (built by ``__new__`` and ``__setstate__``, no code of the file's);
* ``numpy.ndarray``, ``numpy.dtype`` with the dtype classes of bool and numeric
  types, and numpy's own ``_reconstruct`` / ``scalar`` (under numpy 1's and 2's
  module paths), which rebuild arrays and scalars from raw bytes; object arrays
  stay refused, as their dtype class is not on the list;
* ``builtins.getattr``, but bound to :func:`_history_buffer_statistic`, which only
  hands out HistoryBuffer's registered statistics methods.

Any other global still makes the load fail (and its payload never runs): the
list is added with torch's ``safe_globals`` mechanism around that single
``torch.load`` and taken away after it, so no other load in the process sees it
(torch 2.6 or newer; older torch keeps refusing MMEngine's files).

What such a checkpoint means for ``resume`` (the position inside the epoch,
plain scheduler states, the message hub) is the checkpoint part's
(:func:`flexgraph.training.checkpoint.from_mmengine`).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["allow_mmengine_types", "mmengine_globals"]

# numpy dtypes whose values are raw numbers: what HistoryBuffer and the ETA hold.
_NUMERIC_DTYPES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                   np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                   np.complex128)


_STATISTICS = frozenset({"mean", "min", "max", "current"})  # HistoryBuffer's defaults


def _history_buffer_statistic(obj: Any, name: str) -> Any:
    """``getattr`` as MMEngine's pickles use it: HistoryBuffer's statistics methods only."""
    from mmengine.logging import HistoryBuffer

    if obj is HistoryBuffer and isinstance(name, str) and name in _STATISTICS:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f"getattr({getattr(obj, '__name__', type(obj).__name__)}, {name!r}) is not "
        f"one of HistoryBuffer's statistics methods {sorted(_STATISTICS)}")


def mmengine_globals() -> list[Any]:
    """The allow-list, in the form ``torch.serialization.safe_globals`` takes.

    Returns
    -------
    list
        Classes and ``(function, name)`` pairs MMEngine's checkpoints hold (its
        ``HistoryBuffer``, numpy's arrays and scalars).
    """
    from mmengine.logging import HistoryBuffer

    reconstruct = np.empty(0).__reduce__()[0]  # numpy's own, wherever numpy keeps it
    scalar = np.float64(0).__reduce__()[0]
    allowed: list[Any] = [HistoryBuffer, np.ndarray, np.dtype,
                          (_history_buffer_statistic, "builtins.getattr")]
    allowed += [type(np.dtype(t)) for t in _NUMERIC_DTYPES]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):  # numpy 1, numpy 2
        allowed += [(reconstruct, f"{module}._reconstruct"), (scalar, f"{module}.scalar")]
    return allowed


@contextlib.contextmanager
def allow_mmengine_types() -> Iterator[None]:
    """Admit :func:`mmengine_globals` to ``weights_only`` loads inside the ``with`` block.

    Only the entries not already allowed are added, and only those are removed
    afterwards, so an allow-list the user set up stays as it was. Unpickling a
    HistoryBuffer updates its class-wide statistics registry with what the file
    holds; that registry is put back to what it was (plus the four defaults
    every buffer needs), so a file cannot leave entries in it.
    """
    from mmengine.logging import HistoryBuffer

    if torch.torch_version.TorchVersion(torch.__version__) < (2, 6):
        yield  # no (global, name) entries before torch 2.6: MMEngine's files stay refused
        return
    present = set(map(_key, torch.serialization.get_safe_globals()))
    added = [g for g in mmengine_globals() if _key(g) not in present]
    registry = dict(HistoryBuffer._statistics_methods)
    with torch.serialization.safe_globals(added):
        try:
            yield
        finally:
            methods = HistoryBuffer._statistics_methods
            methods.clear()
            methods.update(registry)
            for name in _STATISTICS:
                methods.setdefault(name, getattr(HistoryBuffer, name))


def _key(entry: Any) -> str:
    if isinstance(entry, tuple):
        return entry[1]
    return f"{entry.__module__}.{entry.__qualname__}"
