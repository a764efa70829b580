"""FSDPStrategy: FSDP2 (``torch.distributed.fsdp.fully_shard``) over a process group.

The order, and why (each line is a rewrite below)::

    build_model              rank 0 builds the model whole, on the CPU, as a
                             single-device run builds it (the constructors
                             draw the same random numbers); every other rank
                             builds it on the meta device (no storage)
    activation_checkpointing (when asked) wraps blocks before they are sharded
    init_weights             on rank 0 alone: the model's own init (MMEngine's
                             init_cfg: Pretrained, TruncNormal, ...) on whole
                             tensors, so the weights are bit-identical to a
                             single-device run's; MMEngine's initialisers
                             cannot write into shards
    compile                  (when planned) before sharding, as FSDP2 expects
    fully_shard              each wrap-policy unit, innermost first, then the
                             root; rank 0 then scatters each rank its shards,
                             one unit at a time, and every rank takes rank 0's
                             random-number states, as a one-device run goes on
    load_checkpoint          through the sharded checkpoint IO: each rank reads
                             its own rows of a full file (mapped) or its own
                             shards of a DCP checkpoint
    build_optim_wrapper      on the sharded parameters (built before sharding it
                             would hold the full tensors fully_shard replaced)

What setup costs each rank: rank 0 holds the whole model through
``init_weights`` and until each unit is sent (plus its own shards); every other
rank holds its shards and one unit's share of the scatter, never the model.

When the files the run loads (``load_from``, ``init_cfg`` ``Pretrained``)
cover every entry of the model's ``state_dict``, the run prunes
``init_weights`` before these rewrites (a derived rewrite with its reason,
see :mod:`flexgraph.training.checkpoint`), and no rank builds the model whole::

    build_model              on the meta device, every rank
    fully_shard              each unit, then the root: shards on meta
    materialize              storage for this rank's shards (NaN until loaded)
    load_checkpoint          each rank reads only its own rows of each file
    check_initialised        refuses a parameter the files did not set

``skip_init_weights=True`` asks for the second order whatever the files hold
(the weights come from ``load_from``; ``check_initialised`` refuses what they
lack).

Checkpoints are portable directories (torch.distributed.checkpoint, every rank
writes its own shards, keyed by parameter name, with a manifest), which every
strategy resumes; ``checkpoint_format='native'`` writes the older ``.dcp``
directories, ``state_dict_cfg='full'`` one full file instead.
The option names are MMEngine's ``FSDPStrategy`` / ``MMFullyShardedDataParallel``
ones where they carry over to FSDP2; a key with no FSDP2 meaning is refused by
name rather than ignored.

This face holds the factory, the list of rewrites. Behind it: :mod:`.options`
(MMEngine's options checked and translated), :mod:`.steps` (the step functions
the rewrites bring in), :mod:`.units` (which submodules are sharded, or
checkpointed, after MMEngine's wrap policies), :mod:`.shards` (this rank's
shards: their storage, their rows, loading into them), :mod:`.checkpoint` (the
sharded and full-file checkpoint IOs) and :mod:`.memory` (what a rank holds,
for ``flexgraph plan --estimate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import join_process_group, refuse
from flexgraph.strategies.fsdp.options import checkpoint_io, shard_options
from flexgraph.strategies.names import FSDP

from flexgraph.core.checks import Precedes
from flexgraph.core.rewrite import Configure, IfAbsent, IfPresent, Insert, Move, Remove
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy

__all__ = ["fsdp"]

STEPS = "flexgraph.strategies.fsdp.steps"
SOURCE_RANK = 0
"""The rank that builds and initialises the model whole when init_weights runs."""


def fsdp(
    model_wrapper: Mapping[str, Any] | None = None,
    skip_init_weights: bool = False,
    state_dict_cfg: str | Mapping[str, Any] = "local",
    activation_checkpointing: Mapping[str, Any] | None = None,
    dist_cfg: Mapping[str, Any] | None = None,
    device: str | None = None,
    checkpoint_format: str | None = None,
) -> Strategy:
    """Fully sharded data parallel over a torch.distributed process group.

    The parameters follow MMEngine's ``FSDPStrategy``; each is translated to
    FSDP2 or refused by name.

    Parameters
    ----------
    model_wrapper : Mapping, optional
        Wrap policy, sharding strategy, mixed precision, CPU offload.
    skip_init_weights : bool, default False
        Build the model on the meta device and take the weights from
        ``load_from`` (nothing initialises them): no rank builds the model
        whole, as when the run finds that its files cover the model.
    state_dict_cfg : str or Mapping, default 'local'
        ``'local'``: sharded checkpoints; ``'full'``: one file.
    activation_checkpointing : Mapping, optional
        ``dict(check_fn=...)``; without one, the wrap policy's units are
        checkpointed.
    dist_cfg, device : optional
        As for :func:`~flexgraph.strategies.ddp.ddp`: the process group's
        ``backend`` and ``timeout``, the device to train on.
    checkpoint_format : {'portable', 'native'}, optional
        ``'portable'`` (the default, unless ``state_dict_cfg`` asks for something
        else: sharded, by parameter name, resumable under every strategy) or
        ``'native'`` (what ``state_dict_cfg`` says: ``.dcp`` shards or one full
        file).

    Returns
    -------
    Strategy
        ``fsdp``: the rewrites whose order the module docstring explains.

    Raises
    ------
    StrategyOptionError
        An option with no FSDP2 meaning, or a value FSDP2 cannot honour; the
        message names the key and the fix.
    """
    if checkpoint_format is None:
        checkpoint_format = "portable" if state_dict_cfg == "local" else "native"
    if not isinstance(skip_init_weights, bool):
        raise refuse(FSDP.name, f"skip_init_weights={skip_init_weights!r}",
                     "must be True or False")
    shard = shard_options(model_wrapper)
    rewrites = [join_process_group(device, dist_cfg)]
    if skip_init_weights:
        rewrites.append(IfPresent("init_weights", Remove("init_weights")))
    # Both orders are written out; which applies depends on whether init_weights is
    # still planned (a derived rewrite prunes it when the files cover the model).
    rewrites += [
        Configure("build_model", {"device": "meta"}),
        IfPresent("init_weights", Configure("build_model", {"source_rank": SOURCE_RANK})),
        IfPresent("init_weights", Configure("init_weights", {"source_rank": SOURCE_RANK})),
    ]
    first = "build_model"
    if activation_checkpointing is not None:
        rewrites.append(Insert(Step(
            "activation_checkpointing", f"{STEPS}:checkpoint_blocks", updates="model",
            params={"options": dict(activation_checkpointing),
                    "auto_wrap_policy": shard["auto_wrap_policy"]},
            doc="recompute the chosen blocks' activations in backward"), after=first))
        first = "activation_checkpointing"
    rewrites += [
        IfPresent("init_weights", Insert(Step(
            "fully_shard", f"{STEPS}:shard_from_source", requires="env", updates="model",
            params={**shard, "source_rank": SOURCE_RANK},
            doc="fully_shard each wrap unit and the root; rank 0 scatters each rank its "
                "shards, unit by unit"), after="init_weights")),
        IfAbsent("init_weights", Insert(Step(
            "fully_shard", f"{STEPS}:shard", requires="env", updates="model", params=shard,
            doc="fully_shard each wrap unit and the root (shards on the meta device)"),
            after=first)),
        IfPresent("compile", Move("compile", before="fully_shard")),
        IfAbsent("init_weights", Insert(Step(
            "materialize", f"{STEPS}:materialize", requires="env", updates="model",
            doc="storage for this rank's shards, buffers"), after="fully_shard")),
        Configure("build_checkpointer", {"io": checkpoint_io(state_dict_cfg),
                                         "checkpoint_format": checkpoint_format}),
        IfAbsent("init_weights", Insert(Step(
            "check_initialised", f"{STEPS}:check_initialised", requires="env",
            updates="model", doc="refuse parameters neither init nor load_from set"),
            after="load_checkpoint")),
    ]
    checks = [
        Precedes("fully_shard", "build_optim_wrapper",
                 "an optimizer built before sharding holds the full parameters that "
                 "fully_shard replaces with shards, and would update tensors the model "
                 "no longer uses"),
        Precedes("fully_shard", "load_checkpoint",
                 "the sharded checkpoint IO loads into this rank's shards, which exist "
                 "only once the model is sharded"),
        Precedes("materialize", "load_checkpoint",
                 "the sharded checkpoint IO loads into this rank's shards, which have no "
                 "storage before materialize", first_optional=True),
        Precedes("init_weights", "fully_shard",
                 "MMEngine's initialisers (init_cfg: Pretrained, TruncNormal, ...) copy whole "
                 "tensors, which fails on shards; and a sharded init draws other random "
                 "numbers than a single-device run", first_optional=True),
    ]
    memory = {k: v for k, v in shard.items() if k != "hybrid_mesh" or isinstance(v, tuple)}
    return Strategy(FSDP.name, rewrites, doc="fully sharded data parallel (FSDP2)",
                    world_size="many", checks=tuple(checks), memory_model=FSDP.memory_model,
                    memory_options={**memory,
                                    "activation_checkpointing": activation_checkpointing},
                    prunable=("init_weights",))
