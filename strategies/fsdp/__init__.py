"""FSDPStrategy: FSDP2 (``torch.distributed.fsdp.fully_shard``) over a process group.

No rank holds the model: every rank builds on the meta device, shards, then gets
storage for its shards; ``init_weights`` makes a one-device run's weights from rank 0's
record and sends each rank its rows. Options are MMEngine's ``FSDPStrategy`` keys where
they carry over to FSDP2; a key with no FSDP2 meaning is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import join_process_group, refuse
from flexgraph.strategies.fsdp.options import checkpoint_io, shard_options
from flexgraph.strategies.names import FSDP

from flexgraph.core.checks import Precedes
from flexgraph.core.rewrite import Configure, IfPresent, Insert, Move, Remove, Replace
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy
from flexgraph.training.graph import NO_META

__all__ = ["fsdp"]

STEPS = "flexgraph.strategies.fsdp.steps"
CONTRACTS = "flexgraph.strategies.fsdp.contracts"
SOURCE_RANK = 0  # records the one-device setup and makes each parameter for all
NO_STORAGE = ("the sharded checkpoint IO loads into this rank's shards, which have no storage "
              "before materialize")
NO_ROWS = ("init_weights writes each rank's rows into its shards, which have no storage before "
           "materialize")


def fsdp(
    model_wrapper: Mapping[str, Any] | None = None,
    skip_init_weights: bool = False,
    state_dict_cfg: str | Mapping[str, Any] = "local",
    activation_checkpointing: Mapping[str, Any] | bool | None = None,
    dist_cfg: Mapping[str, Any] | None = None,
    device: str | None = None,
    checkpoint_format: str | None = None,
) -> Strategy:
    """Fully sharded data parallel over a torch.distributed process group.

    Parameters
    ----------
    model_wrapper : Mapping, optional
        Wrap policy, sharding strategy, mixed precision, CPU offload.
    skip_init_weights : bool, default False
        Take the weights from the loaded files alone.
    state_dict_cfg : str or Mapping, default 'local'
        ``'local'``: sharded checkpoints; ``'full'``: one file.
    activation_checkpointing : Mapping or bool, optional
        ``dict(check_fn=...)``; ``True``: the wrap policy's units.
    dist_cfg, device : optional
        As for :func:`~flexgraph.strategies.ddp.ddp`.
    checkpoint_format : {'portable', 'native'}, optional
        ``'portable'`` (default): by parameter name, resumable under every
        strategy; ``'native'``: what ``state_dict_cfg`` says.

    Returns
    -------
    Strategy

    Raises
    ------
    StrategyOptionError
        An option with no FSDP2 meaning, or a value FSDP2 cannot honour.
    """
    if checkpoint_format is None:
        checkpoint_format = "portable" if state_dict_cfg == "local" else "native"
    if not isinstance(skip_init_weights, bool):
        raise refuse(FSDP.name, f"skip_init_weights={skip_init_weights!r}",
                     "must be True or False")
    if isinstance(activation_checkpointing, bool):
        activation_checkpointing = {} if activation_checkpointing else None
    elif not isinstance(activation_checkpointing, (Mapping, type(None))):
        raise refuse(FSDP.name, f"activation_checkpointing={activation_checkpointing!r}",
                     "must be True or dict(check_fn=...)")
    shard = shard_options(model_wrapper)
    rewrites = [join_process_group(device, dist_cfg)]
    if skip_init_weights:
        rewrites.append(IfPresent("init_weights", Remove("init_weights"), why=(
            "skip_init_weights=True: the weights come from load_from, nothing initialises "
            "them")))
    rewrites.append(Configure("build_model", {"device": "meta"}, ends=("whole",),
                              contracts=(f"{CONTRACTS}:source_alone_whole",), why=(
        "no rank builds the model whole: every rank builds on meta and gets its shards later")))
    first = "build_model"
    if activation_checkpointing is not None:
        rewrites.append(Insert(Step(
            "activation_checkpointing", f"{STEPS}:checkpoint_blocks", updates="model",
            params={"options": dict(activation_checkpointing),
                    "auto_wrap_policy": shard["auto_wrap_policy"]},
            doc="recompute the chosen blocks' activations in backward"), after=first,
            why="blocks are wrapped for recomputation before they are sharded"))
        first = "activation_checkpointing"
    sharded = {"updates": "model", "ends": ("whole", "unwrapped"),
               "expects": f"{CONTRACTS}:dtypes_uniform",
               "contracts": f"{CONTRACTS}:forward_writes_kept"}
    rewrites += [
        Insert(Step(
            "fully_shard", f"{STEPS}:shard", requires="env", params=shard, gives="sharded",
            **sharded, doc="fully_shard each wrap unit and the root (shards on the meta device)"),
            after=first, why="every rank keeps only its shards of each wrap unit and of the root"),
        IfPresent("compile", Move("compile", before="fully_shard",
                                  why="FSDP2 expects the model compiled before it is sharded")),
        Insert(Step("materialize", f"{STEPS}:materialize", requires="env", updates="model",
                    gives="on_device", contracts=NO_META,
                    doc="storage for this rank's shards, buffers"),
               after="fully_shard", why=NO_STORAGE),
        IfPresent("init_weights", Replace("init_weights", Step(
            "init_weights", "flexgraph.training.steps:init_from_record",
            requires=("cfg", "env"), updates="model", gives="initialised",
            params={"place": f"{STEPS}:scatter_rows", "source_rank": SOURCE_RANK},
            doc="a one-device run's init_weights, made unit by unit on rank 0 from its "
                "record, each rank sent its rows"), why=(
            "MMEngine's initialisers copy whole tensors, which fails on shards, and a sharded "
            "init draws other random numbers than a single-device run: rank 0 records that "
            "run's init and makes each parameter again from the record"))),
        IfPresent("init_weights", Move("init_weights", after="materialize", why=NO_ROWS)),
        Configure("build_checkpointer", {"io": checkpoint_io(state_dict_cfg),
                                         "checkpoint_format": checkpoint_format},
                  why="each rank reads and writes its own shards"),
        Configure("load_checkpoint", contracts=(f"{CONTRACTS}:every_parameter_set",), why=(
            "the shards start as NaN: a parameter neither init_weights nor load_from set "
            "would train from garbage")),
    ]
    checks = [
        Precedes("fully_shard", "build_optim_wrapper",
                 "an optimizer built before sharding holds the full parameters that "
                 "fully_shard replaces with shards, and would update tensors the model "
                 "no longer uses"),
        Precedes("fully_shard", "load_checkpoint",
                 "the sharded checkpoint IO loads into this rank's shards, which exist only "
                 "once the model is sharded"),
        Precedes("materialize", "load_checkpoint", NO_STORAGE),
        Precedes("materialize", "init_weights", NO_ROWS),
    ]
    memory = {k: v for k, v in shard.items() if k != "hybrid_mesh" or isinstance(v, tuple)}
    return Strategy(FSDP.name, rewrites, doc="fully sharded data parallel (FSDP2)",
                    world_size="many", checks=tuple(checks), memory_model=FSDP.memory_model,
                    memory_options={**memory,
                                    "activation_checkpointing": activation_checkpointing},
                    prunable=("init_weights",))
