"""A one-device setup recorded without values, then made again one part at a time, bit for bit.

A sharded run wants a one-device run's weights without any rank holding the
model. :func:`record_setup` runs the setup with fake parameters and notes every
operation that writes a parameter or makes a tensor from one, with the CPU
generator's state before each draw; replaying what a parameter depends on gives
every kernel the same inputs, so the values match bit for bit. What cannot be
recorded (``.numpy()``, a C extension, a value-dependent shape) fails; the setup
is then recorded again with the failing module's parameters real (``whole``).
"""

from __future__ import annotations

import bisect
import contextlib
import math
import sys
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from flexgraph.training.runtime._draws import (
    VALUE_READS,
    Draw,
    SourceDraws,
    _draw_of,
    _overload,
    _uses_default_generator,
    host_generators_moved,
)

aten = torch.ops.aten


class ReplayError(RuntimeError):
    """The setup cannot be recorded or made again as it ran; the message says why."""

    def __init__(self, message: str, module: str | None = None) -> None:
        super().__init__(message)
        self.module = module


@attrs.frozen
class View:
    """A tensor as an operation saw it: which recorded storage, and where in it."""

    storage: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


@attrs.frozen(eq=False)
class Held:
    """A real tensor an operation took, with its version (``None`` on the other ranks)."""

    tensor: torch.Tensor | None
    version: int

    def value(self) -> torch.Tensor:
        if self.tensor is None:
            raise ReplayError("a tensor the setup read is held by the rank that recorded it")
        if self.tensor._version != self.version:
            raise ReplayError("a tensor the setup read (a buffer, a constant) changed after "
                              "the read, so the read cannot be made again")
        return self.tensor


@attrs.frozen(eq=False)
class Op:
    """One recorded operation (``func=None``: a parameter's first contents).

    ``makes``: per output, the view of the storage it makes; ``state``: the CPU
    generator's state before a draw.
    """

    func: str | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    writes: tuple[int, ...]
    reads: tuple[int, ...]
    makes: tuple[View | None, ...]
    state: torch.Tensor | None = None
    overwrites: bool = False


_OVERWRITERS = frozenset({
    "aten::uniform_", "aten::normal_", "aten::random_", "aten::bernoulli_",
    "aten::exponential_", "aten::geometric_", "aten::log_normal_", "aten::cauchy_",
    "aten::fill_", "aten::zero_", "aten::copy_"})
"""In-place operations whose result does not depend on what the tensor held."""

_EMPTY = frozenset({aten.empty.memory_format, aten.empty_strided.default,
                    aten.new_empty.default, aten.new_empty_strided.default,
                    aten.empty_like.default})
"""Operations whose output holds no values yet."""

_VALUE_OUT = (*VALUE_READS, aten.equal.default)
"""Operations that hand a tensor's values to Python."""


def _is_fake(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for extent, step in reversed(list(zip(size, stride, strict=True))):
        if extent != 1 and step != expected:
            return False
        expected *= extent
    return True


def _written_positions(func: Any) -> set[int | str]:
    """The argument positions (and names) ``func`` writes in place."""
    written: set[int | str] = set()
    for index, argument in enumerate(func._schema.arguments):
        info = argument.alias_info
        if info is not None and info.is_write:
            written |= {index, argument.name}
    return written


def _split(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
           ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors ``func`` writes, and the others it takes."""
    positions = _written_positions(func)
    written: list[torch.Tensor] = []
    others: list[torch.Tensor] = []
    for key, value in [*enumerate(args), *kwargs.items()]:
        tensors = [v for v in tree_leaves(value) if isinstance(v, torch.Tensor)]
        (written if key in positions else others).extend(tensors)
    return written, others


def _bookkeeping() -> bool:
    """Whether MMEngine's ``update_init_info`` (the initialisation log) is reading."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "update_init_info" and "mmengine" in code.co_filename:
            return True
        frame = frame.f_back
    return False


class _Log:
    """The recorded operations, and how to make any storage's value from them."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.touching: dict[int, list[int]] = defaultdict(list)  # storage -> op indices
        self.numel: dict[int, int] = {}
        self.dtype: dict[int, torch.dtype] = {}
        self.writes: dict[int, int] = defaultdict(int)  # storage -> writes so far
        self.derived: dict[int, frozenset[tuple[int, int]]] = {}  # made -> (storage, writes)

    def add(self, op: Op) -> None:
        index = len(self.ops)
        self.ops.append(op)
        for key in dict.fromkeys((*op.writes, *(v.storage for v in op.makes if v))):
            self.touching[key].append(index)
        sources = frozenset().union(*(self.derived.get(r, {(r, self.writes[r])})
                                      for r in op.reads))
        for made in op.makes:
            if made is not None and op.func is not None:
                self.derived[made.storage] = sources
        for key in op.writes:
            self.writes[key] += 1

    def changed(self, key: int) -> bool:
        """Whether ``a != b`` compared into ``key`` comes from different writes: MMEngine's
        check that an initialiser changed a parameter's mean, answered without values."""
        compared = self.ops[self.touching[key][0]].reads
        return len({self.derived.get(r) for r in compared}) > 1

    def live(self, needs: Sequence[tuple[int, int]], cached: dict[int, int]
             ) -> tuple[list[int], set[int]]:
        """The operations ``needs`` ((storage, before op index) pairs) depend on, in order,
        and the storages that start from ``cached`` (storage -> op index)."""
        live: set[int] = set()
        seen: set[tuple[int, int]] = set()
        from_cache: set[int] = set()
        todo = list(needs)
        while todo:
            key, before = todo.pop()
            start = cached.get(key)
            if start is not None:
                if start > before:
                    raise _CacheTooNew
                from_cache.add(key)
            touching = self.touching.get(key, [])
            for index in reversed(touching[:bisect.bisect_left(touching, before)]):
                if (start is not None and index < start) or (key, index) in seen:
                    break
                seen.add((key, index))
                live.add(index)
                op = self.ops[index]
                todo += [(other, index) for other in op.reads if other != key]
                if op.overwrites and key in op.writes or any(
                        v is not None and v.storage == key for v in op.makes):
                    break
        if any(index < cached[key] for index in live for key in self.ops[index].writes
               if key in from_cache):
            raise _CacheTooNew  # an earlier operation would write a cached value again
        return sorted(live), from_cache

    def run(self, live: list[int], bases: dict[int, torch.Tensor], keep: set[int]) -> None:
        """Make ``live`` operations again into ``bases``, dropping storages not in ``keep``
        after their last use."""
        last: dict[int, int] = {}
        for index in live:
            op = self.ops[index]
            for key in (*op.reads, *op.writes, *(v.storage for v in op.makes if v)):
                last[key] = index
        for index in live:
            self._make(self.ops[index], bases)
            for key in [k for k, i in last.items() if i == index and k not in keep]:
                bases.pop(key, None)

    def _base(self, key: int, bases: dict[int, torch.Tensor]) -> torch.Tensor:
        if key not in bases:
            bases[key] = torch.empty(self.numel[key], dtype=self.dtype[key])
        return bases[key]

    def view(self, view: View, bases: dict[int, torch.Tensor]) -> torch.Tensor:
        return self._base(view.storage, bases).as_strided(view.size, view.stride, view.offset)

    def _make(self, op: Op, bases: dict[int, torch.Tensor]) -> None:
        if op.func is None:
            (made,) = op.makes
            target = self.view(made, bases)
            if op.args[0] is not None:
                target.copy_(op.args[0].value())
            return

        def real(value: Any) -> Any:
            if isinstance(value, View):
                return self.view(value, bases)
            if isinstance(value, Held):
                return value.value()
            return value

        args, kwargs = tree_map(real, (op.args, op.kwargs))
        if op.state is not None:
            torch.set_rng_state(op.state)
        out = _overload(op.func)(*args, **kwargs)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        for made, tensor in zip(op.makes, outputs, strict=False):
            if made is None:
                continue
            if (tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()) != \
                    (made.size, made.stride, made.offset):
                raise ReplayError(f"{op.func} laid out its output otherwise than when it was "
                                  f"recorded; it cannot be made again")
            storage = tensor.untyped_storage()
            bases[made.storage] = torch.empty(0, dtype=made.dtype).set_(
                storage, 0, (storage.nbytes() // tensor.element_size(),), (1,))


class _CacheTooNew(Exception):
    """A cached value stands later than a read needs it."""


class _Recorder(TorchDispatchMode):
    """Records what the setup does to fake tensors (see the module docstring)."""

    def __init__(self) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        super().__init__()
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.log = _Log()
        self.keys: dict[int, int] = {}
        self.storages: list[Any] = []  # kept alive: no address is reused while recording
        self.fresh: weakref.WeakSet[Any] = weakref.WeakSet()
        self.draws: list[Draw] = []
        self.cache: dict[int, tuple[torch.Tensor, int]] = {}

    def key(self, tensor: torch.Tensor) -> int:
        storage = tensor.untyped_storage()
        address = storage._cdata
        if address not in self.keys:
            key = len(self.storages)
            self.keys[address] = key
            self.storages.append(storage)
            self.log.numel[key] = storage.nbytes() // tensor.element_size()
            self.log.dtype[key] = tensor.dtype
        key = self.keys[address]
        if self.log.dtype[key] != tensor.dtype:
            raise ReplayError(f"the setup reads a tensor as {tensor.dtype} and as "
                              f"{self.log.dtype[key]}")
        return key

    def view(self, tensor: torch.Tensor) -> View:
        return View(self.key(tensor), tuple(tensor.shape), tuple(tensor.stride()),
                    tensor.storage_offset(), tensor.dtype)

    def shape(self, value: Any) -> Any:
        if _is_fake(value):
            return self.view(value)
        if isinstance(value, torch.Tensor):
            return Held(value, value._version)
        return value

    def fake_parameter(self, param: torch.Tensor) -> nn.Parameter:
        """A fake stand-in for the real ``param`` a module registers."""
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), self.fake:
            data = torch.empty_strided(tuple(param.shape), tuple(param.stride()),
                                       dtype=param.dtype)
        empty = param.untyped_storage() in self.fresh
        self.log.add(Op(None, (None if empty else Held(param.detach(), param._version),), {},
                        (), (), (self.view(data),)))
        return type(param)(data, requires_grad=param.requires_grad, **dict(param.__dict__))

    def values(self, views: Sequence[View], *, keep: bool = False) -> list[torch.Tensor]:
        """Real tensors for ``views`` as they stand now (the generators left as they are)."""
        state = torch.get_rng_state()
        now = len(self.log.ops)
        needs = [(v.storage, now) for v in views]
        cached = {key: at for key, (_, at) in self.cache.items()} if keep else {}
        try:
            live, from_cache = self.log.live(needs, cached)
        except _CacheTooNew:
            self.cache.clear()
            cached = {}
            live, from_cache = self.log.live(needs, cached)
        bases = {key: self.cache[key][0] for key in from_cache}
        wanted = {v.storage for v in views}
        try:
            with torch.no_grad():
                self.log.run(live, bases, wanted)
        finally:
            torch.set_rng_state(state)
        if keep:  # the values wanted stand now; an intermediate one may stand earlier
            self.cache = {key: (bases[key], now) for key in wanted}
        return [self.log.view(v, bases) for v in views]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        leaves = [v for v in tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        if not any(_is_fake(t) for t in leaves):
            if seeded and _uses_default_generator(kwargs):
                self.draws.append(_draw_of(func, args, kwargs))
            written, _ = _split(func, args, kwargs)
            for tensor in written:
                self.fresh.discard(tensor.untyped_storage())
            out = func(*args, **kwargs)
            if func in _EMPTY:
                self.fresh.add(out.untyped_storage())
            return out
        if func in _VALUE_OUT:
            if _bookkeeping():
                fake = next(t for t in leaves if _is_fake(t))
                return self.log.changed(self.key(fake))
            real = iter(self.values([self.view(t) for t in leaves if _is_fake(t)], keep=True))
            args, kwargs = tree_map(lambda v: next(real) if _is_fake(v) else v, (args, kwargs))
            with torch.no_grad():
                return func(*args, **kwargs)
        state = None
        if seeded:
            if not _uses_default_generator(kwargs):
                raise ReplayError(f"{func} draws from a generator of its own, whose state "
                                  f"the record cannot follow")
            state = torch.get_rng_state()
            draw = _draw_of(func, args, kwargs)
            self.draws.append(draw)
            draw.make()  # the generator advances as the one-device draw advances it
        written, others = _split(func, args, kwargs)
        if any(not _is_fake(t) for t in written):
            raise ReplayError(f"{func} writes a real tensor from a parameter, which has no "
                              f"values while recording")
        out = func(*args, **kwargs)
        self._note(func, args, kwargs, written, others, out, state)
        return out

    def _note(self, func: Any, args: Any, kwargs: dict[str, Any], written: list[torch.Tensor],
              others: list[torch.Tensor], out: Any, state: torch.Tensor | None) -> None:
        makes: list[View | None] = []
        for tensor in (t for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
            if not _is_fake(tensor):
                raise ReplayError(f"{func} gave a real tensor from a parameter")
            makes.append(None if tensor.untyped_storage()._cdata in self.keys
                         else self.view(tensor))
        writes = tuple(dict.fromkeys(self.key(t) for t in written))
        if not writes and not any(makes):
            return  # a view, or a value no one keeps
        reads = tuple(dict.fromkeys(self.key(t) for t in others if _is_fake(t)))
        views = [self.view(t) for t in written]
        overwrites = (f"{func._schema.name}" in _OVERWRITERS and not set(writes) & set(reads)
                      and all(v.offset == 0 and _contiguous(v.size, v.stride)
                              and math.prod(v.size) == self.log.numel[v.storage] for v in views))
        if not overwrites:
            reads = tuple(dict.fromkeys((*reads, *writes)))
        args, kwargs = tree_map(self.shape, (tuple(args), dict(kwargs)))
        self.log.add(Op(f"{func._schema.name}.{func._overloadname}", args, kwargs, writes, reads,
                        tuple(makes), state, overwrites))


@contextlib.contextmanager
def _diverted(recorder: _Recorder) -> Iterator[None]:
    """Modules built inside register fake stand-ins for their parameters."""
    register = nn.Module.register_parameter

    def register_fake(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not _is_fake(param):
            param = recorder.fake_parameter(param)
        register(module, name, param)

    nn.Module.register_parameter = register_fake
    try:
        yield
    finally:
        nn.Module.register_parameter = register


@attrs.frozen(eq=False)
class SetupRecord:
    """What :func:`record_setup` noted: how to make each parameter's and buffer's value.

    Attributes
    ----------
    log : object
    params, buffers : dict
        Name -> its recorded view, or a real value (initialised whole).
    initialised : tuple of str
        The modules MMEngine marked initialised (``_is_init``).
    whole : tuple of str
        The modules whose ``init_weights`` ran on real parameters.
    drawn : SourceDraws
    reasons : tuple of str
        Why each of ``whole`` could not be recorded.
    """

    log: _Log
    params: dict[str, View | Held]
    buffers: dict[str, View | Held]
    initialised: tuple[str, ...]
    whole: tuple[str, ...]
    drawn: SourceDraws
    reasons: tuple[str, ...] = ()

    def _live(self, names: Sequence[str]) -> tuple[dict[str, View | Held], list[int]]:
        entries = {name: self.params.get(name, self.buffers.get(name)) for name in names}
        views = [e for e in entries.values() if isinstance(e, View)]
        live, _ = self.log.live([(v.storage, len(self.log.ops)) for v in views], {})
        return entries, live

    def reads_held(self, names: Sequence[str]) -> bool:
        """Whether making ``names`` reads a real tensor only the recording rank holds."""
        entries, live = self._live(names)
        held = [*entries.values(), *(a for i in live for a in tree_leaves(
            (self.log.ops[i].args, self.log.ops[i].kwargs)))]
        return any(isinstance(h, Held) for h in held)

    def made_in_turn(self, runs: Sequence[Sequence[str]], *, source: int, rank: int,
                     world: int) -> Iterator[tuple[int, dict[str, torch.Tensor] | None]]:
        """Per run of names: the rank that makes it and, there, its values (``None`` elsewhere)."""
        makers = [source if self.reads_held(run) else index % world
                  for index, run in enumerate(runs)]
        for start in range(0, len(runs), world):
            group = range(start, min(start + world, len(runs)))
            made = {i: self.values(runs[i]) for i in group if makers[i] == rank}
            for i in group:
                yield makers[i], made.pop(i, None)

    def portable(self) -> SetupRecord:
        """This record without the real tensors it holds, to send to the other ranks."""
        def drop(value: Any) -> Any:
            return Held(None, value.version) if isinstance(value, Held) else value

        log = _Log()
        log.__dict__.update(self.log.__dict__)
        log.ops = [attrs.evolve(op, args=tree_map(drop, op.args), kwargs=tree_map(drop, op.kwargs))
                   for op in self.log.ops]
        return attrs.evolve(self, log=log, params={k: drop(v) for k, v in self.params.items()},
                            buffers={k: drop(v) for k, v in self.buffers.items()})

    def values(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """``names``' values after the setup as whole CPU tensors (the generators put back)."""
        entries, live = self._live(names)
        views = {name: e for name, e in entries.items() if isinstance(e, View)}
        bases: dict[int, torch.Tensor] = {}
        state = torch.get_rng_state()
        try:
            with torch.no_grad():
                self.log.run(live, bases, {v.storage for v in views.values()})
        finally:
            torch.set_rng_state(state)
        return {name: entry.value() if isinstance(entry, Held) else
                self.log.view(entry, bases) for name, entry in entries.items()}


def _failed_in(model: nn.Module | None, error: BaseException) -> str | None:
    """The innermost module of ``model`` whose ``init_weights`` the traceback passes through."""
    if model is None:
        return ""
    names = {id(m): name for name, m in model.named_modules()}
    found = None
    trace = error.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "init_weights" and id(owner) in names:
            found = names[id(owner)]
        trace = trace.tb_next
    return found


def _realise(recorder: _Recorder, model: nn.Module, whole: Sequence[str]) -> None:
    """The parameters of the ``whole`` modules made real, holding their values so far."""
    chosen = {id(p): p for name in whole for p in model.get_submodule(name).parameters()
              if _is_fake(p)}
    if not chosen:
        return
    made = dict(zip(chosen, recorder.values([recorder.view(p) for p in chosen.values()]),
                    strict=True))
    real = {key: nn.Parameter(value.clone(), requires_grad=chosen[key].requires_grad)
            for key, value in made.items()}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) in real:
                module._parameters[name] = real[id(param)]


def _entry(recorder: _Recorder, tensor: torch.Tensor) -> View | Held:
    return recorder.view(tensor) if _is_fake(tensor) else Held(tensor.detach(), tensor._version)


def record_setup(build: Callable[[], nn.Module], init: Callable[[nn.Module], Any], *,
                 whole: Sequence[str] = ()) -> tuple[nn.Module, SetupRecord]:
    """Run ``build()`` then ``init(model)`` as one device would, recording them.

    Parameters
    ----------
    build : callable
    init : callable
    whole : sequence of str
        Modules initialised on real parameters (``''``: the whole model).

    Returns
    -------
    tuple of (torch.nn.Module, SetupRecord)
        The model as recorded (fake parameters, real buffers), and the record.

    Raises
    ------
    ReplayError
        Its ``module`` says where.
    """
    from flexgraph.training.runtime._rng import capture_rng

    recorder = _Recorder()
    before = capture_rng()
    model = None
    try:
        with recorder:
            with contextlib.nullcontext() if "" in whole else _diverted(recorder):
                model = build()
            _realise(recorder, model, [name for name in whole if name])
            init(model)
    except Exception as exc:  # where the record failed decides what is made whole
        raise ReplayError(f"{type(exc).__name__}: {exc}",
                          _failed_in(model, exc) or "") from exc
    record = SetupRecord(
        log=recorder.log,
        params={name: _entry(recorder, p)
                for name, p in model.named_parameters(remove_duplicate=False)},
        buffers={name: _entry(recorder, b)
                 for name, b in model.named_buffers(remove_duplicate=False)},
        initialised=tuple(name for name, m in model.named_modules()
                          if getattr(m, "_is_init", False)),
        whole=tuple(whole),
        drawn=SourceDraws(draws=recorder.draws, rng=capture_rng(),
                          host_draws=host_generators_moved(before)))
    return model, record
