"""The random draws a piece of code makes, recorded on one rank and made again on another.

When one rank initialises the model for all (ZeRO-3's setup: rank 0 holds the
whole model, the others only their partitions), the other ranks skip the
initialisers, and with them the random numbers those draw. Under
``randomness.diff_rank_seed`` every rank has a generator of its own, which a
DDP run advances through the same initialisers on every rank, so each rank
ends setup at the state its own seed reaches after them: the dropout masks of
training depend on it. Copying rank 0's state would make every rank draw the
same masks.

A generator's advance depends on what was drawn (the operation, how many
elements of which dtype, on which device), never on the values in the tensor it
writes. So rank 0 records each random operation the initialisers call
(:func:`recording_draws`, a dispatch mode: every ATen operation tagged
``nondeterministic_seeded`` that uses the default generator), as shapes, and
the other ranks make the same draws into scratch tensors of those shapes, one
at a time (:func:`replay_draws`): their generators end where a DDP rank's
would, and none holds more than the largest tensor drawn.

When no rank initialises (every weight comes from a file, so ``init_weights``
is pruned), a one-device run still draws the initialisers' random numbers
before it loads: :func:`parameters_without_values` gives a model parameters
that have shapes and no values (torch's fake tensors; a ``meta`` tensor would
not do, as torch's initialisers skip those), on which each random operation
also draws into a scratch tensor on the CPU, where a one-device run
initialises, so the generator ends where that run's does, holding one tensor
at a time. Reads of their values (MMEngine's initialisers compare each
parameter's mean before and after) give zeros.

Python's ``random`` and numpy's generators are not seen here (MMEngine's
initialisers draw from torch alone); :func:`host_generators_moved` tells
whether code drew from them.

:func:`drawn_by` (on the rank that initialises) and :func:`follow_source_draws`
(on the others) put these together for any strategy whose setup has one rank
initialise for all (FSDP's, ZeRO-3's): without ``diff_rank_seed`` every rank
takes the source's states, with it each replays the source's draws from its
own.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import attrs
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

__all__ = ["VALUE_READS", "Draw", "SourceDraws", "TensorShape", "drawn_by", "fake_parameter",
           "follow_source_draws", "host_generators_moved", "parameters_without_values",
           "recording_draws", "replay_draws", "stood_in"]

T = TypeVar("T")


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
        """An uninitialised tensor of this shape, strides and dtype, on this rank's device
        (the CPU for a meta tensor: where a one-device run initialises)."""
        device = {"meta": "cpu"}.get(self.device_type, self.device_type)
        if device == "cuda":
            device = f"cuda:{torch.cuda.current_device()}"
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)


@attrs.frozen
class Draw:
    """One random operation: the ATen overload's name and its arguments, tensors as shapes.

    Parameters
    ----------
    op : str
        The ATen overload's qualified name.
    args : tuple
        Its positional arguments, tensors as :class:`TensorShape`.
    kwargs : dict
        Its keyword arguments, tensors as :class:`TensorShape`.
    """

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


def _overload(name: str) -> Any:
    """``'aten::uniform_.default'`` -> ``torch.ops.aten.uniform_.default``."""
    namespace, _, rest = name.partition("::")
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _uses_default_generator(kwargs: dict[str, Any]) -> bool:
    generator = kwargs.get("generator")
    return generator is None or generator is torch.default_generator


def _is_draw(func: Any, kwargs: dict[str, Any]) -> bool:
    return torch.Tag.nondeterministic_seeded in func.tags and _uses_default_generator(kwargs)


def _draw_of(func: Any, args: Any, kwargs: dict[str, Any]) -> Draw:
    shapes = tree_map(lambda v: TensorShape.of(v) if isinstance(v, torch.Tensor) else v,
                      (tuple(args), dict(kwargs)))
    return Draw(func.name() + "." + func._overloadname, *shapes)


class _DrawRecorder(TorchDispatchMode):
    """Notes every seeded random operation on the default generators, then runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[Draw] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _is_draw(func, kwargs):
            self.draws.append(_draw_of(func, args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def recording_draws() -> Iterator[list[Draw]]:
    """Record the random draws made inside: yields the list, filled as they happen.

    Returns
    -------
    contextlib.AbstractContextManager
        A context manager whose value is the list of :class:`Draw`, in order.
    """
    recorder = _DrawRecorder()
    with recorder:
        yield recorder.draws


class _DrawsForFakes(TorchDispatchMode):
    """Above torch's fake-tensor mode: a random operation also draws for real, into a
    scratch tensor; a value read gives 0. ``states``: where to note the CPU generator's
    state before each draw (``None``: nowhere); ``draws``: where to note the draws."""

    def __init__(self, states: list[torch.Tensor] | None = None,
                 draws: list[Draw] | None = None) -> None:
        super().__init__()
        self.states = states
        self.draws = draws

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        kwargs = kwargs or {}
        if _is_draw(func, kwargs):
            draw = _draw_of(func, args, kwargs)
            if self.states is not None:
                self.states.append(torch.get_rng_state())
            if self.draws is not None:
                self.draws.append(draw)
            with unset_fake_temporarily():
                draw.make()
        if func in VALUE_READS:
            return 0  # .item() / bool() of a value that does not exist
        return func(*args, **kwargs)


VALUE_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)
"""The operations that hand a tensor's value to Python (``.item()``, ``bool()``)."""


@contextlib.contextmanager
def stood_in(model: torch.nn.Module, stand_in: Callable[[torch.nn.Parameter], torch.nn.Parameter]
             ) -> Iterator[dict[int, torch.nn.Parameter]]:
    """Every parameter of ``model`` replaced by ``stand_in(param)`` for the duration (one
    stand-in per parameter: a shared one stays shared), the originals put back after.

    Yields the stand-ins by the ``id`` of the parameter each stands in for.
    """
    stand_ins: dict[int, torch.nn.Parameter] = {}
    swapped = []
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in stand_ins:
                stand_ins[id(param)] = stand_in(param)
            swapped.append((module, name, param))
            module._parameters[name] = stand_ins[id(param)]
    try:
        yield stand_ins
    finally:
        for module, name, param in swapped:
            module._parameters[name] = param


def fake_parameter(param: torch.nn.Parameter, shape: Any) -> torch.nn.Parameter:
    """A parameter of ``shape`` and ``param``'s dtype without values (call it inside a
    ``FakeTensorMode``)."""
    return torch.nn.Parameter(torch.empty(tuple(shape), dtype=param.dtype),
                              requires_grad=param.requires_grad)


@contextlib.contextmanager
def parameters_without_values(model: torch.nn.Module,
                              shape_of: Callable[[torch.nn.Parameter], Any] | None = None,
                              *, states: list[torch.Tensor] | None = None,
                              draws: list[Draw] | None = None) -> Iterator[None]:
    """Code inside runs on ``model`` with parameters that have shapes and no values, and
    draws the random numbers it would draw on real ones.

    Each parameter stands in as a fake tensor of its shape (torch's
    ``FakeTensorMode``: the CPU as its device, no storage), and every random
    operation also draws into a scratch tensor of its shape on the CPU, one at
    a time. The original parameters are put back after (a shared one stays
    shared); buffers stay what they are. ``shape_of(param)``: a parameter's
    whole shape, where its own is not (ZeRO-3's partitioned placeholders).
    ``states`` and ``draws`` record the run, for making it again part by part.

    Parameters
    ----------
    model : torch.nn.Module
        The model whose parameters stand in without values.
    shape_of : callable, optional
        A parameter's whole shape, where its own is not.
    states : list of torch.Tensor, optional
        Where the CPU generator's state before each draw is appended.
    draws : list of Draw, optional
        Where each draw is appended.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    shape_of = shape_of or (lambda param: param.shape)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with contextlib.ExitStack() as stack:
        with fake:  # the stand-ins made fake
            stack.enter_context(stood_in(
                model, lambda param: fake_parameter(param, shape_of(param))))
        with fake, _DrawsForFakes(states, draws):
            yield


def replay_draws(draws: list[Draw]) -> None:
    """Make ``draws`` again, in order, into scratch tensors (one alive at a time).

    Parameters
    ----------
    draws : list of Draw
        What :func:`recording_draws` recorded.
    """
    for draw in draws:
        draw.make()


def host_generators_moved(before: dict[str, Any]) -> bool:
    """Whether Python's or numpy's global generator drew since ``before``.

    Parameters
    ----------
    before : dict
        A :func:`~flexgraph.training.runtime.capture_rng` state.

    Returns
    -------
    bool
        Either generator's state differs from ``before``'s.
    """
    np_now = np.random.get_state()
    np_before = before["numpy"]
    return (random.getstate() != before["python"]
            or int(np_now[2]) != np_before["pos"]
            or not np.array_equal(np_now[1].astype(np.int64), np_before["keys"].numpy()))


@attrs.frozen
class SourceDraws:
    """What the rank that initialised for all tells the others of its random numbers
    (small: shapes and generator states; it pickles).

    Attributes
    ----------
    draws : list of Draw
        Each seeded random operation it made on the default generators, in order.
    rng : dict
        Its generator states after them (:func:`~flexgraph.training.runtime.capture_rng`).
    host_draws : bool
        Whether Python's or numpy's generator drew too (not replayed).
    """

    draws: list[Draw]
    rng: dict[str, Any]
    host_draws: bool


def drawn_by(action: Callable[[], T]) -> tuple[T, SourceDraws]:
    """Run ``action``, recording the random numbers it draws.

    Parameters
    ----------
    action : callable
        What the initialising rank does (``init_weights`` on its whole model).

    Returns
    -------
    tuple of (object, SourceDraws)
        ``action``'s result, and what the other ranks need to follow it
        (:func:`follow_source_draws`).
    """
    from flexgraph.training.runtime._rng import capture_rng

    before = capture_rng()
    with recording_draws() as draws:
        result = action()
    return result, SourceDraws(draws=list(draws), rng=capture_rng(),
                               host_draws=host_generators_moved(before))


def follow_source_draws(done: SourceDraws, *, diff_rank_seed: bool, warn: bool = True) -> None:
    """This rank's generators where a DDP rank's would be after the source's setup.

    A rank that skipped the initialisers the source ran draws nothing; a DDP
    rank would have drawn what they draw. Without ``diff_rank_seed`` every
    rank has the source's generator, so it takes the source's states; with it
    each rank has its own, advanced by the same draws made again here
    (:func:`replay_draws`), so that the dropout masks of training stay each
    rank's own.

    Parameters
    ----------
    done : SourceDraws
        What the source recorded (:func:`drawn_by`).
    diff_rank_seed : bool
        ``randomness.diff_rank_seed`` of the run.
    warn : bool, default True
        Warn when the source drew from Python's or numpy's generator under
        ``diff_rank_seed`` (those are not replayed); one rank says it for all.
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
