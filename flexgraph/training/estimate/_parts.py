"""What a strategy's memory model returns, and the model states most strategies share.

A strategy's memory model is a module of its own (:attr:`Strategy.memory_model`) with:

``estimate_memory(census, *, world_size, amp, optimizer_states, **memory_options)``
    a :class:`StrategyMemory`.
``candidate_options(options, stage, precision)``
    the options for a candidate ``NAME[:STAGE][:PRECISION]`` (:class:`CandidateError`).
``estimate_setup(census, *, world_size, target_device, weights_loaded, **memory_options)``
    optional: a :class:`SetupMemory`; without it, every rank holds the whole model.
``traced_model(model, **memory_options)``
    optional: the changed meta model to trace (FSDP's activation checkpointing), or ``None``.
``estimate_steps(census, *, world_size, target_device, weights_loaded, memory, **memory_options)``
    optional: each allocating step's :class:`Allocation`; without it, the model whole.
"""

from __future__ import annotations

import attrs

from flexgraph.training.errors import ConfigError

from ._census import Census

_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


class CandidateError(ConfigError):
    """A candidate names a stage or precision its strategy does not have."""


@attrs.frozen
class StrategyMemory:
    """Per-rank bytes of a strategy's model states and buffers (activations are traced).

    Parameters
    ----------
    label : str
        The strategy's name in the table (``'deepspeed zero2'``).
    parameters, gradients, optimizer, buffers : int
        Bytes held at the end of backward (optimizer: master weights included; buffers:
        the strategy's own, buckets or gathered units).
    compute : str
        The trace mode (``COMPUTE_MODES``).
    modelled, notes : tuple of str
        The parts computed from formulas rather than counted; what the figures assume.
    reference : int, optional
        The strategy's library's own figure for the same states.
    step_gradients, step_buffers : int, optional
        What is alive during the optimizer step, where it differs (ZeRO frees some).
    stepped : tuple of (int, int), default (0, 0)
        The largest tensor and all elements the optimizer steps on, for its temporaries.
    """

    label: str
    parameters: int
    gradients: int
    optimizer: int
    buffers: int
    compute: str
    modelled: tuple[str, ...] = ("buffers",)
    notes: tuple[str, ...] = ()
    reference: int | None = None
    step_gradients: int | None = None
    step_buffers: int | None = None
    stepped: tuple[int, int] = (0, 0)

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer


@attrs.frozen
class SetupMemory:
    """Host bytes a rank holds while the model is set up, before the optimizer exists.

    Counted: the parameters as the rank holds them and the largest tensor in flight;
    not the process itself, the buffers, or a mapped checkpoint's page cache.

    Parameters
    ----------
    rank0, others, notes
        Rank 0's bytes, every other rank's, and what they assume.
    """

    rank0: int
    others: int
    notes: tuple[str, ...] = ()

    def node(self, processes: int) -> int:
        return self.rank0 + max(processes - 1, 0) * self.others


@attrs.frozen
class Allocation:
    """Bytes a step allocates (negative: frees) on some ranks, in host or device memory.

    Parameters
    ----------
    step, bytes, what
        The step, the bytes, what they are in words.
    ranks : {'all', 'rank0', 'others'}, default 'all'
    memory : {'host', 'device'}, default 'host'
    transient : bool, default False
        Held only while the step runs.
    """

    step: str
    bytes: int
    what: str
    ranks: str = "all"
    memory: str = "host"
    transient: bool = False

    def as_dict(self) -> dict[str, object]:
        return attrs.asdict(self)


def trains_on(target_device: str) -> str:
    """Where the training step's tensors live: ``'host'`` on the CPU, else ``'device'``.

    Parameters
    ----------
    target_device : str

    Returns
    -------
    str
    """
    return "host" if target_device == "cpu" else "device"


def whole_model_steps(census: Census, memory: StrategyMemory, target_device: str, *,
                      placed_at: str = "wrap_model", extra: int = 0, extra_what: str = "",
                      states: int = 0) -> tuple[Allocation, ...]:
    """Every rank builds the whole model on the host; ``placed_at`` makes it the trained one.

    Parameters
    ----------
    census, memory, target_device
        ``memory.parameters`` are what the rank trains.
    placed_at : str, default 'wrap_model'
        The step that moves the model to the device (and adds ``extra`` and ``states``).
    extra, extra_what : int, str
        Bytes allocated there besides the parameters (DDP's buckets), and what they are.
    states : int, default 0
        Optimizer state bytes allocated there (DeepSpeed's engine makes them).

    Returns
    -------
    tuple of Allocation
    """
    where = trains_on(target_device)
    steps = [Allocation("build_model", census.param_bytes, "the whole model (fp32), as built")]
    if where == "device" or memory.parameters != census.param_bytes:
        steps += [Allocation(placed_at, -census.param_bytes, "the model as built, replaced"),
                  Allocation(placed_at, memory.parameters, "the parameters as trained",
                             memory=where)]
    if extra:
        steps.append(Allocation(placed_at, extra, extra_what, memory=where))
    if states:
        steps.append(Allocation(placed_at, states, "master weights and optimizer states",
                                memory=where))
    return tuple(steps)


def whole_model_setup(census: Census, *, extra: int = 0,
                      notes: tuple[str, ...] = ()) -> SetupMemory:
    """Every rank builds and initialises the whole model (as built, fp32), plus ``extra``.

    Parameters
    ----------
    census, notes
    extra : int, default 0
        Bytes every rank holds besides the model.

    Returns
    -------
    SetupMemory
    """
    whole = census.param_bytes + extra
    return SetupMemory(rank0=whole, others=whole,
                       notes=("every rank builds and initialises the whole model", *notes))


def bytes_per(precision: str | None) -> int:
    """Bytes of one element in ``precision`` (``None``: fp32).

    Parameters
    ----------
    precision : str or None

    Returns
    -------
    int
    """
    return _BYTES[precision or "fp32"]


def replicated_states(census: Census, *, label: str, amp: str | None,
                      optimizer_states: int, buffers: int = 0,
                      notes: tuple[str, ...] = ()) -> StrategyMemory:
    """Every rank holds the whole model: fp32 parameters, gradients and optimizer states.

    Autocast keeps the weights in fp32; its low-precision copies are counted by the trace.

    Parameters
    ----------
    census, label, buffers, notes
        As :class:`StrategyMemory` takes them.
    amp : str or None
        The AMP precision (the trace mode follows it).
    optimizer_states : int
        fp32 states per trainable parameter.

    Returns
    -------
    StrategyMemory
    """
    grads = census.trainable * 4
    return StrategyMemory(label=label, parameters=census.param_bytes, gradients=grads,
                          optimizer=optimizer_states * census.trainable * 4, buffers=buffers,
                          compute=f"amp:{amp}" if amp else "fp32", notes=notes,
                          stepped=(census.largest_param, census.trainable))
