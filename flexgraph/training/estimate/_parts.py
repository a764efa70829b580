"""What a strategy's memory model returns, and the model states most strategies share.

A strategy's memory model is a module of its own (:attr:`Strategy.memory_model`) with:

``estimate_memory(census, *, world_size, amp, optimizer_states, **memory_options)``
    a :class:`StrategyMemory`.
``candidate_options(options, stage, precision)``
    the strategy's options for a ``--compare`` candidate ``NAME[:STAGE][:PRECISION]``,
    raising :class:`CandidateError` for a stage or precision it does not have.
``estimate_setup(census, *, world_size, target_device, weights_loaded, **memory_options)``
    optional: a :class:`SetupMemory`; without it, every rank holds the whole model.
``traced_model(model, **memory_options)``
    optional: the changed meta model to trace (FSDP's activation checkpointing), or ``None``.
``estimate_steps(census, *, world_size, target_device, weights_loaded, memory, **memory_options)``
    optional: the :class:`Allocation` of each step of its plan that allocates;
    without it, every rank builds the model whole.
"""

from __future__ import annotations

import attrs

from flexgraph.training.errors import ConfigError

from ._census import Census

__all__ = ["Allocation", "CandidateError", "SetupMemory", "StrategyMemory",
           "replicated_states", "whole_model_setup", "whole_model_steps"]

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
    parameters, gradients, optimizer : int
        Bytes this rank holds at the end of backward (optimizer: master weights included).
    buffers : int
        Bytes of the strategy's own buffers (buckets, gathered units).
    compute : str
        The trace mode (``COMPUTE_MODES``).
    modelled : tuple of str, default ('buffers',)
        The parts computed from formulas rather than counted.
    notes : tuple of str, default ()
        What the figures assume, one line each.
    reference : int, optional
        The strategy's library's own figure for the same states, if it has one.
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

    On a GPU run this is host memory, which a node's ranks share. Counted: the
    parameters as the rank holds them and the largest tensor in flight; not the
    process itself, the buffers, or a mapped checkpoint's page cache.

    Parameters
    ----------
    rank0 : int
    others : int
        Every other rank's bytes (less where rank 0 initialises for all).
    notes : tuple of str, default ()
    """

    rank0: int
    others: int
    notes: tuple[str, ...] = ()

    def node(self, processes: int) -> int:
        """What a node holding rank 0 and ``processes - 1`` other ranks holds."""
        return self.rank0 + max(processes - 1, 0) * self.others


@attrs.frozen
class Allocation:
    """Bytes a step allocates (negative: frees) on some ranks, in host or device memory.

    Parameters
    ----------
    step : str
    bytes : int
    what : str
        What they are, in words.
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
    census : Census
    memory : StrategyMemory
        Its ``parameters`` are what the rank trains.
    target_device : str
    placed_at : str, default 'wrap_model'
        The step that moves the model to the device (and adds ``extra`` and ``states``).
    extra : int, default 0
        Bytes allocated there besides the parameters (DDP's buckets), ``extra_what``.
    extra_what : str, default ''
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
    census : Census
    extra : int, default 0
        Bytes every rank holds besides the model.
    notes : tuple of str, default ()

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
    census : Census
    label : str
    amp : str or None
        The AMP precision (the trace mode follows it).
    optimizer_states : int
        fp32 states per trainable parameter.
    buffers : int, default 0
    notes : tuple of str, default ()

    Returns
    -------
    StrategyMemory
    """
    grads = census.trainable * 4
    return StrategyMemory(label=label, parameters=census.param_bytes, gradients=grads,
                          optimizer=optimizer_states * census.trainable * 4, buffers=buffers,
                          compute=f"amp:{amp}" if amp else "fp32", notes=notes,
                          stepped=(census.largest_param, census.trainable))
