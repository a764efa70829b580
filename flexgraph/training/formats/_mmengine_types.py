"""The few types MMEngine's checkpoints pickle, admitted to ``weights_only`` loads and no more.

An MMEngine checkpoint's ``message_hub`` holds ``HistoryBuffer`` objects and
numpy values, which ``weights_only`` refuses; any other global still fails the load.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

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
    """The allow-list, in the form ``torch.serialization.safe_globals`` takes."""
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
    """Admit :func:`mmengine_globals` to ``weights_only`` loads inside the ``with`` block;
    after, only its own entries go and HistoryBuffer's statistics registry is put back."""
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
