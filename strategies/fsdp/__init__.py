"""FSDPStrategy: FSDP2 (``torch.distributed.fsdp.fully_shard``) over a process group.

The order, and why (each line is a rewrite below)::

    build_model              on the CPU, as a single-device run builds it: the
                             constructors draw the same random numbers
    activation_checkpointing (when asked) wraps blocks before they are sharded
    init_weights             the model's own init (MMEngine's init_cfg:
                             Pretrained, TruncNormal, ...) on whole tensors, so
                             the weights are bit-identical to a single-device
                             run's; MMEngine's initialisers cannot write into shards
    compile                  (when planned) before sharding, as FSDP2 expects
    fully_shard              every rank takes rank 0's weights (as DDP does when
                             it wraps), then each wrap-policy unit is sharded,
                             innermost first, then the root: every parameter
                             becomes this rank's DTensor shard, on its device
    load_checkpoint          through the sharded checkpoint IO: rank 0 reads a
                             full file and each rank receives its shard; a DCP
                             checkpoint is read shard by shard
    build_optim_wrapper      on the sharded parameters (built before sharding it
                             would hold the full tensors fully_shard replaced)

Building and initialising whole costs each rank the full model in host memory
for the duration of setup, as DDP and MMEngine's FSDPStrategy do; the
accelerator holds shards only. With ``skip_init_weights=True`` (the weights come
from ``load_from``) no rank ever holds the whole model: it is built on the meta
device, sharded, and only each rank's shards get storage (``materialize``)
before they are loaded.

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
checkpointed, after MMEngine's wrap policies) and :mod:`.memory` (what a rank
holds, for ``flexgraph plan --estimate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import join_process_group, refuse
from flexgraph.strategies.fsdp.options import checkpoint_io, shard_options
from flexgraph.strategies.names import FSDP

from flexgraph.core.checks import Precedes
from flexgraph.core.rewrite import Configure, IfPresent, Insert, Move, Remove
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy

__all__ = ["fsdp"]

STEPS = "flexgraph.strategies.fsdp.steps"


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
        ``load_from`` (nothing initialises them).
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
        rewrites.append(Configure("build_model", {"device": "meta"}))
    first = "build_model"
    if activation_checkpointing is not None:
        rewrites.append(Insert(Step(
            "activation_checkpointing", f"{STEPS}:checkpoint_blocks", updates="model",
            params={"options": dict(activation_checkpointing),
                    "auto_wrap_policy": shard["auto_wrap_policy"]},
            doc="recompute the chosen blocks' activations in backward"), after=first))
        first = "activation_checkpointing"
    sharded_after = first if skip_init_weights else "init_weights"
    rewrites += [
        Insert(Step("fully_shard", f"{STEPS}:shard", requires="env", updates="model",
                    params={**shard, "broadcast_from_rank0": not skip_init_weights},
                    doc="rank 0's weights to every rank, then fully_shard each wrap unit "
                        "and the root"),
               after=sharded_after),
        IfPresent("compile", Move("compile", before="fully_shard")),
    ]
    if skip_init_weights:
        rewrites += [
            Insert(Step("materialize", f"{STEPS}:materialize", requires="env", updates="model",
                        doc="storage for this rank's shards, buffers"),
                   after="fully_shard"),
            Remove("init_weights"),
        ]
    loaded_after = "materialize" if skip_init_weights else "fully_shard"
    rewrites += [
        Move("load_checkpoint", after=loaded_after),
        Configure("build_checkpointer", {"io": checkpoint_io(state_dict_cfg),
                                         "checkpoint_format": checkpoint_format}),
    ]
    if skip_init_weights:
        rewrites.append(Insert(Step(
            "check_initialised", f"{STEPS}:check_initialised", requires="env", updates="model",
            doc="refuse parameters neither init nor load_from set"), after="load_checkpoint"))
    checks = [
        Precedes("fully_shard", "build_optim_wrapper",
                 "an optimizer built before sharding holds the full parameters that "
                 "fully_shard replaces with shards, and would update tensors the model "
                 "no longer uses"),
        Precedes(loaded_after, "load_checkpoint",
                 "the sharded checkpoint IO loads into this rank's shards, which exist "
                 "only once the model is sharded" + (" and materialized" if skip_init_weights
                                                    else "")),
    ]
    if not skip_init_weights:
        checks.append(Precedes(
            "init_weights", "fully_shard",
            "MMEngine's initialisers (init_cfg: Pretrained, TruncNormal, ...) copy whole "
            "tensors, which fails on shards; and a sharded init draws other random "
            "numbers than a single-device run"))
    memory = {k: v for k, v in shard.items() if k != "hybrid_mesh" or isinstance(v, tuple)}
    return Strategy(FSDP.name, rewrites, doc="fully sharded data parallel (FSDP2)",
                    world_size="many", checks=tuple(checks), memory_model=FSDP.memory_model,
                    memory_options={**memory,
                                    "activation_checkpointing": activation_checkpointing})
