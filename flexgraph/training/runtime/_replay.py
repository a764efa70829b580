"""``init_weights`` made again one part of the model at a time, with one device's values.

MMEngine's ``init_weights`` writes whole tensors, and draws its random numbers
in one order over the whole model (a parent's ``init_cfg`` reaches its
children, then each child's own runs). A rank that holds one part of the
model at a time can still give that part the values one device gives it, in
two steps (the idea behind torchdistx's deferred init):

1. :func:`record_init` runs ``init_weights`` once with every parameter
   without values (:func:`~flexgraph.training.runtime.parameters_without_values`)
   and notes the CPU generator's state before each draw: an :class:`InitRecord`
   (a few KiB a draw; one rank records, the record travels).
2. :func:`init_part` runs it again with the parameters of one part real (CPU
   tensors holding their values as built) and every other one without values.
   A draw into a tensor without values is not made: the generator jumps to
   the state the record has after it. A draw into a real tensor is made, from
   the state the record has before it, so it draws what one device draws.
   Every other operation on real tensors runs for real. So the part ends with
   the values it has after a one-device ``init_weights``, bit for bit.

:func:`init_part` checks that the run follows the record: at every draw the
generator must be at the recorded state, and after the last at the recorded
end. It refuses (:class:`ReplayError`) a run that departs from the record (its
draws depend on values), and one that writes a real tensor from a value that
does not exist in this pass (the part's init reads another part's parameter,
as a tied weight's copy does): such parameters belong in one part.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flexgraph.training.runtime._draws import (
    VALUE_READS,
    Draw,
    _is_draw,
    fake_parameter,
    parameters_without_values,
    stood_in,
)

__all__ = ["InitRecord", "ReplayError", "init_part", "record_init"]


class ReplayError(RuntimeError):
    """A part's ``init_weights`` cannot be made again on its own: the message says why."""


@attrs.frozen
class InitRecord:
    """What one ``init_weights`` run drew: the CPU generator's state before each draw, the
    state after the last, and the draws (as shapes, for a rank that only follows them)."""

    before: tuple[torch.Tensor, ...]
    end: torch.Tensor
    draws: tuple[Draw, ...]

    def after(self, index: int) -> torch.Tensor:
        """The generator's state after draw ``index``."""
        return self.before[index + 1] if index + 1 < len(self.before) else self.end


def record_init(model: torch.nn.Module, run: Callable[[], None],
                shape_of: Callable[[torch.nn.Parameter], Any] | None = None) -> InitRecord:
    """Run ``run()`` (``init_weights``) on ``model`` without values, recording its draws.

    The generator advances as the real run would advance it (the draws are
    made, into scratch tensors); no parameter is touched.
    """
    states: list[torch.Tensor] = []
    draws: list[Draw] = []
    with parameters_without_values(model, shape_of, states=states, draws=draws):
        run()
    return InitRecord(tuple(states), torch.get_rng_state(), tuple(draws))


def _fakes(values: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(v, FakeTensor) for v in tree_leaves(values))


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place (its schema's mutable arguments)."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write:
            continue
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        written += [v for v in tree_leaves(value) if isinstance(v, torch.Tensor)]
    return written


class _Replay(TorchDispatchMode):
    """Above torch's fake-tensor mode: real tensors' operations run for real, fake ones'
    on fakes; draws follow ``record`` (see the module docstring)."""

    def __init__(self, record: InitRecord, part: str) -> None:
        super().__init__()
        self.record = record
        self.part = part
        self.index = 0

    def _at(self, state: torch.Tensor, where: str) -> None:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # real states, compared outside the fake mode
            moved = not torch.equal(torch.get_rng_state(), state)
        if moved:
            raise ReplayError(f"init_weights of {self.part} drew otherwise than when it was "
                              f"recorded without values ({where}): its draws depend on values")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        kwargs = kwargs or {}
        fakes = _fakes((args, kwargs))
        if _is_draw(func, kwargs):
            if self.index >= len(self.record.before):
                raise ReplayError(f"init_weights of {self.part} drew more than when it was "
                                  f"recorded without values: its draws depend on values")
            self._at(self.record.before[self.index], f"draw {self.index}")
            after = self.record.after(self.index)
            self.index += 1
            if fakes:
                torch.set_rng_state(after)  # a draw no one keeps: skipped
                return func(*args, **kwargs)
        elif func in VALUE_READS and fakes:
            return 0
        if not fakes:
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if any(not _fakes(t) for t in _written(func, args, kwargs)):
            raise ReplayError(f"init_weights of {self.part} writes it from values of another "
                              f"part ({func}): those parameters must be initialised together")
        return func(*args, **kwargs)

    def finish(self) -> None:
        if self.index != len(self.record.before):
            raise ReplayError(f"init_weights of {self.part} drew less than when it was "
                              f"recorded without values: its draws depend on values")
        self._at(self.record.end, "at its end")


@contextlib.contextmanager
def _replaying(model: torch.nn.Module, values: dict[int, torch.Tensor], record: InitRecord,
               part: str, shape_of: Callable[[torch.nn.Parameter], Any]) -> Iterator[None]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)

    def stand_in(param: torch.nn.Parameter) -> torch.nn.Parameter:
        if id(param) in values:
            return torch.nn.Parameter(values[id(param)], requires_grad=param.requires_grad)
        with fake:
            return fake_parameter(param, shape_of(param))

    replay = _Replay(record, part)
    with stood_in(model, stand_in) as stand_ins:
        torch.set_rng_state(record.before[0] if record.before else record.end)
        with fake, replay:
            yield
        replay.finish()
        for key in values:  # an initialiser may have replaced a stand-in's data
            values[key] = stand_ins[key].data


def init_part(model: torch.nn.Module, values: dict[int, torch.Tensor], run: Callable[[], None],
              record: InitRecord, part: str,
              shape_of: Callable[[torch.nn.Parameter], Any] | None = None) -> None:
    """``run()`` (``init_weights``) again, for the parameters in ``values`` alone.

    Parameters
    ----------
    model:
        The model whose ``init_weights`` ``run`` calls.
    values:
        ``id(parameter)`` -> a whole CPU tensor holding its value as built; on
        return, its value after ``init_weights``, as one device has it.
    run:
        The call of ``init_weights`` (as :func:`record_init` got it).
    record:
        What :func:`record_init` noted (on any rank: the generator states are
        the ones this run follows).
    part:
        The part's name, for messages.
    shape_of:
        A parameter's whole shape, where its own is not.

    Raises
    ------
    ReplayError
        The run departs from the record, or writes the part from another part's values.
    """
    with _replaying(model, values, record, part, shape_of or (lambda param: param.shape)):
        run()
