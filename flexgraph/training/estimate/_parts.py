"""What a strategy's memory model returns, and the model states most strategies share.

A strategy contributes its memory model from its own module in
``flexgraph.strategies`` (named by :attr:`Strategy.memory_model`), a module
with two functions:

``estimate_memory(census, *, world_size, amp, optimizer_states, **memory_options)``
    returns :class:`StrategyMemory`: the per-rank bytes of parameters,
    gradients, optimizer states (master weights included) and the strategy's
    own buffers, and the compute mode its step runs in (which the step's trace
    uses). ``amp`` is the config's autocast precision (``'fp16'``, ``'bf16'``
    or ``None``); ``optimizer_states`` the fp32 states per trainable parameter
    (2 for Adam).
``candidate_options(options, stage, precision)``
    returns the strategy's options for a ``--compare`` candidate
    ``NAME[:STAGE][:PRECISION]`` (``options``: the config's, when the config
    names this strategy), raising :class:`CandidateError` for a stage or
    precision the strategy does not have.

and, where the strategy changes the model's step before it trains, a third:

``traced_model(model, **memory_options)``
    does that to ``model`` (built on the meta device for this candidate
    alone) and returns it, or returns ``None`` when these options change
    nothing; the estimate then traces the returned model (FSDP's activation
    checkpointing).
"""

from __future__ import annotations

import attrs

from flexgraph.training.errors import ConfigError

from ._census import Census

__all__ = ["CandidateError", "StrategyMemory", "replicated_states"]

_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


class CandidateError(ConfigError):
    """A ``--compare`` / ``--strategy auto`` candidate names a stage or precision
    its strategy does not have; the message lists the ones it has."""


@attrs.frozen
class StrategyMemory:
    """Per-rank bytes of a strategy's model states and buffers (activations are traced).

    Parameters
    ----------
    label : str
        What the strategy is called in the table (``'ddp'``, ``'deepspeed zero2'``).
    parameters : int
        Bytes of the parameters this rank holds.
    gradients : int
        Bytes of the gradients at the end of backward.
    optimizer : int
        Bytes of the optimizer's states (master weights included).
    buffers : int
        Bytes of the strategy's own buffers (buckets, gathered units).
    compute : str
        The trace mode (see ``COMPUTE_MODES``).
    modelled : tuple of str, default ('buffers',)
        The parts computed from formulas rather than counted tensor by tensor
        (shown as such).
    notes : tuple of str, default ()
        One line each: what the figures assume.
    reference : int, optional
        A figure the strategy's own library gives for the same model states,
        when it has one.
    step_gradients : int, optional
        The gradient bytes alive during the optimizer step, where they differ
        from ``gradients`` (ZeRO-1 frees its whole gradients once their partition
        is reduced).
    step_buffers : int, optional
        Likewise the buffers alive during the step (DeepSpeed frees its reduce
        and all-gather buckets before it).
    stepped : tuple of (int, int), default (0, 0)
        The largest tensor and all elements the optimizer steps on at this rank,
        in fp32, whose size its step's temporaries take.
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


def bytes_per(precision: str | None) -> int:
    """Bytes of one element in ``precision`` (``None``: fp32).

    Parameters
    ----------
    precision : str or None
        ``'fp32'``, ``'fp16'``, ``'bf16'``, or ``None`` (fp32).

    Returns
    -------
    int
        Bytes per element.
    """
    return _BYTES[precision or "fp32"]


def replicated_states(census: Census, *, label: str, amp: str | None,
                      optimizer_states: int, buffers: int = 0,
                      notes: tuple[str, ...] = ()) -> StrategyMemory:
    """Every rank holds the whole model: fp32 parameters, gradients and optimizer states.

    AMP (autocast) keeps the weights in fp32; the low-precision copies of the
    weights autocast makes live with the activations (the trace counts them).

    Parameters
    ----------
    census : Census
        The model's parameter counts.
    label : str
        The strategy's label in the table.
    amp : str or None
        The AMP precision (the trace mode follows it).
    optimizer_states : int
        fp32 states per trainable parameter.
    buffers : int, default 0
        The strategy's own buffers, in bytes.
    notes : tuple of str, default ()
        What the figures assume.

    Returns
    -------
    StrategyMemory
        The per-rank bytes of a strategy that replicates the model.
    """
    grads = census.trainable * 4
    return StrategyMemory(label=label, parameters=census.param_bytes, gradients=grads,
                          optimizer=optimizer_states * census.trainable * 4, buffers=buffers,
                          compute=f"amp:{amp}" if amp else "fp32", notes=notes,
                          stepped=(census.largest_param, census.trainable))
