"""FSDPStrategy: FSDP2 (``torch.distributed.fsdp.fully_shard``); no rank holds the whole model.

The order, and why (each line is a rewrite below)::

    build_model on meta      parameters get shapes but no storage, so building
                             a model bigger than one rank's memory costs nothing
    activation_checkpointing (when asked) wraps blocks before they are sharded
    compile                  (when planned) before sharding, as FSDP2 expects
    fully_shard              each wrap-policy unit, innermost first, then the root:
                             every parameter becomes this rank's DTensor shard
    materialize              storage for the shards only, buffers put back, each
                             module's reset_parameters() redone on its shard
    init_weights             the model's own init, now on real (sharded) tensors
    load_checkpoint          the sharded loader: rank 0 reads a full file and
                             each rank receives its shard; a DCP checkpoint is
                             read shard by shard
    build_optim_wrapper      on the sharded parameters (built before sharding it
                             would hold the full tensors fully_shard replaced)

Checkpoints are sharded directories (torch.distributed.checkpoint, every rank
writes its own shards); ``state_dict_cfg='full'`` writes one full file instead.
The option names are MMEngine's ``FSDPStrategy`` / ``MMFullyShardedDataParallel``
ones where they carry over to FSDP2; a key with no FSDP2 meaning is refused by
name rather than ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.core.checks import Precedes, Runs
from flexgraph.core.rewrite import Configure, IfPresent, Insert, Move, Remove, Replace
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy, StrategyOptionError

HERE = "flexgraph.strategies.fsdp"
DCP_IO = "flexgraph.training.checkpoint_dcp:DistributedCheckpointIO"
FULL_IO = "flexgraph.training.checkpoint_dcp:FullStateFileIO"
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
_WRAPPER_KEYS = ("type", "auto_wrap_policy", "sharding_strategy", "mixed_precision",
                 "cpu_offload", "use_orig_params")
_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")


def _refuse(key: str, why: str) -> StrategyOptionError:
    return StrategyOptionError(f"strategy 'fsdp': {key} {why}")


def _shard_options(model_wrapper: Mapping[str, Any] | None) -> dict[str, Any]:
    """MMEngine's ``model_wrapper`` keys, checked and translated to ``fully_shard`` params."""
    wrapper = dict(model_wrapper or {})
    for key in wrapper:
        if key not in _WRAPPER_KEYS:
            raise _refuse(f"model_wrapper.{key}", f"has no FSDP2 meaning; FSDP2 takes "
                          f"{', '.join(_WRAPPER_KEYS[1:])}")
    if wrapper.get("type", "MMFullyShardedDataParallel") != "MMFullyShardedDataParallel":
        raise _refuse("model_wrapper.type", f"{wrapper['type']!r}: FSDP2 is applied, not a "
                      "wrapper class; drop the type")
    if wrapper.get("use_orig_params", True) is not True:
        raise _refuse("model_wrapper.use_orig_params=False", "has no FSDP2 meaning: FSDP2 "
                      "always keeps the original parameters; drop it")
    sharding = str(wrapper.get("sharding_strategy", "FULL_SHARD")).rpartition(".")[2]
    if sharding not in _RESHARD:
        hint = ("use DDPStrategy" if sharding == "NO_SHARD" else
                "hybrid sharding needs a 2-D device mesh, which this strategy does not build")
        raise _refuse(f"model_wrapper.sharding_strategy={sharding!r}",
                      f"is not supported ({hint}); use FULL_SHARD or SHARD_GRAD_OP")
    precision = wrapper.get("mixed_precision")
    if precision is not None:
        precision = {k: str(v).removeprefix("torch.") if k != "cast_forward_inputs" else v
                     for k, v in dict(precision).items()}
        for key in precision:
            if key not in _PRECISION_KEYS:
                raise _refuse(f"model_wrapper.mixed_precision.{key}",
                              f"has no FSDP2 meaning; FSDP2 takes {', '.join(_PRECISION_KEYS)}")
    offload = wrapper.get("cpu_offload") or False
    if isinstance(offload, Mapping):
        offload = bool(offload.get("offload_params", False))
    return {"auto_wrap_policy": wrapper.get("auto_wrap_policy"),
            "reshard_after_forward": _RESHARD[sharding],
            "mixed_precision": precision, "cpu_offload": bool(offload)}


def _checkpoint_io(state_dict_cfg: str | Mapping[str, Any]) -> str:
    """``'local'`` / ``'full'`` or MMEngine's dict -> sharded (DCP) or full-file checkpoints."""
    if isinstance(state_dict_cfg, Mapping):
        kind = str(state_dict_cfg.get("state_dict_type", "")).rpartition(".")[2]
        full = kind == "FULL_STATE_DICT"
        if not full and kind not in ("SHARDED_STATE_DICT", "LOCAL_STATE_DICT"):
            raise _refuse("state_dict_cfg.state_dict_type", f"{kind!r} is not one of "
                          "FULL_STATE_DICT, SHARDED_STATE_DICT, LOCAL_STATE_DICT")
        return FULL_IO if full else DCP_IO
    if state_dict_cfg not in ("local", "full"):
        raise _refuse(f"state_dict_cfg={state_dict_cfg!r}", "must be 'local' (sharded) or "
                      "'full' (one file), or MMEngine's dict(state_dict_type=...)")
    return FULL_IO if state_dict_cfg == "full" else DCP_IO


def fsdp(
    model_wrapper: Mapping[str, Any] | None = None,
    skip_init_weights: bool = False,
    state_dict_cfg: str | Mapping[str, Any] = "local",
    activation_checkpointing: Mapping[str, Any] | None = None,
    dist_cfg: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> Strategy:
    """Fully sharded data parallel over a torch.distributed process group.

    Parameters follow mmengine's ``FSDPStrategy``: ``model_wrapper`` (wrap
    policy, sharding strategy, mixed precision, CPU offload), ``skip_init_weights``
    (the weights come from ``load_from``), ``state_dict_cfg`` (``'local'``:
    sharded checkpoints; ``'full'``: one file), ``activation_checkpointing``
    (``dict(check_fn=...)``; without one, the wrap policy's units are
    checkpointed), plus ``dist_cfg`` and ``device`` as for DDP.
    """
    if not isinstance(skip_init_weights, bool):
        raise _refuse(f"skip_init_weights={skip_init_weights!r}", "must be True or False")
    shard = _shard_options(model_wrapper)
    rewrites = [
        Replace("setup_env", Step(
            "setup_env", "flexgraph.training.distributed:setup_process_group",
            requires="cfg", provides="env", params={"device": device, **dict(dist_cfg or {})},
            doc="join the process group, pick this rank's device")),
        Configure("build_model", {"device": "meta"}),
    ]
    first = "build_model"
    if activation_checkpointing is not None:
        rewrites.append(Insert(Step(
            "activation_checkpointing", f"{HERE}:checkpoint_blocks", updates="model",
            params={"options": dict(activation_checkpointing),
                    "auto_wrap_policy": shard["auto_wrap_policy"]},
            doc="recompute the chosen blocks' activations in backward"), after=first))
        first = "activation_checkpointing"
    loaded_after = "materialize" if skip_init_weights else "init_weights"
    rewrites += [
        Insert(Step("fully_shard", f"{HERE}:shard", requires="env", updates="model",
                    params=shard, doc="fully_shard each wrap unit, then the root"),
               after=first),
        IfPresent("compile", Move("compile", before="fully_shard")),
        Insert(Step("materialize", f"{HERE}:materialize", requires="env", updates="model",
                    params={"reset_parameters": not skip_init_weights},
                    doc="storage for this rank's shards, buffers, reset_parameters"),
               after="fully_shard"),
        Remove("init_weights") if skip_init_weights else Move("init_weights", after="materialize"),
        Replace("load_checkpoint", Step(
            "load_checkpoint", f"{HERE}:load_into_shards", requires=("cfg", "env", "hooks"),
            updates="model", doc="load_from into the shards (rank 0 reads a full file)")),
        Move("load_checkpoint", after=loaded_after),
        Configure("build_checkpointer", {"io": _checkpoint_io(state_dict_cfg)}),
    ]
    checks = (
        Precedes("fully_shard", "build_optim_wrapper",
                 "an optimizer built before sharding holds the full parameters that "
                 "fully_shard replaces with shards, and would update tensors the model "
                 "no longer uses"),
        Precedes("materialize", "init_weights",
                 "before materialize the parameters are on the meta device, with no "
                 "storage: initialising them there does nothing"),
        Precedes("materialize", "load_checkpoint",
                 "before materialize there is no storage to load weights into"),
        Runs("load_checkpoint", f"{HERE}:load_into_shards",
             "a whole-model loader copies full tensors into parameters that are now "
             "shards; the sharded loader gives each rank its own shard"),
    )
    return Strategy("fsdp", rewrites, doc="fully sharded data parallel (FSDP2)",
                    world_size="many", checks=checks)


# -- step functions ---------------------------------------------------------------------------

def _dtype(name: str | None) -> Any:
    import torch

    return None if name is None else getattr(torch, name)


def shard(env: Any, model: Any, *, auto_wrap_policy: Any = None,
          reshard_after_forward: bool = True, mixed_precision: Mapping[str, Any] | None = None,
          cpu_offload: bool = False) -> Any:
    """``fully_shard`` every unit the wrap policy picks (innermost first), then the root."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    from flexgraph.training.sharding import resolve_wrap_policy, wrap_units

    precision = dict(mixed_precision or {})
    policy = MixedPrecisionPolicy(
        param_dtype=_dtype(precision.get("param_dtype")),
        reduce_dtype=_dtype(precision.get("reduce_dtype")),
        output_dtype=_dtype(precision.get("output_dtype")),
        cast_forward_inputs=precision.get("cast_forward_inputs", True))
    options: dict[str, Any] = {"reshard_after_forward": reshard_after_forward,
                               "mp_policy": policy}
    if cpu_offload:
        if not str(env.device).startswith("cuda"):
            import warnings

            warnings.warn("strategy 'fsdp': model_wrapper.cpu_offload is ignored on a CPU run "
                          "(the parameters already live in CPU memory)", stacklevel=1)
        else:
            options["offload_policy"] = CPUOffloadPolicy()
    wrap = resolve_wrap_policy(auto_wrap_policy, model, what="model_wrapper.auto_wrap_policy")
    for unit in wrap_units(model, wrap):
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return model


def materialize(env: Any, model: Any, *, reset_parameters: bool = True) -> Any:
    """Storage on ``env.device`` for this rank's shards; see ``materialize_module``."""
    from flexgraph.training.materialize import materialize_module

    return materialize_module(model, env.device, reset_parameters=reset_parameters,
                              rank=env.rank)


def checkpoint_blocks(model: Any, *, options: Mapping[str, Any],
                      auto_wrap_policy: Any = None) -> Any:
    """Activation checkpointing, MMEngine's ``activation_checkpointing=dict(check_fn=...)``.

    Without a ``check_fn``, the units the wrap policy shards are checkpointed.
    """
    from mmengine.registry import FUNCTIONS

    from flexgraph.training.build import build_from_cfg, resolve_type
    from flexgraph.training.errors import ConfigError
    from flexgraph.training.sharding import (
        checkpoint_activations,
        resolve_wrap_policy,
        wrap_units,
    )

    extra = sorted(set(options) - {"check_fn"})
    if extra:
        raise ConfigError(f"strategy 'fsdp': activation_checkpointing.{extra[0]} is not "
                          f"supported; activation_checkpointing takes check_fn")
    check_fn = options.get("check_fn")
    what = "activation_checkpointing.check_fn"
    if isinstance(check_fn, Mapping):
        check_fn = build_from_cfg(check_fn, FUNCTIONS, what=what)
    elif isinstance(check_fn, str):
        check_fn = resolve_type(check_fn, FUNCTIONS, what=what)
    if check_fn is None:
        units = wrap_units(model, resolve_wrap_policy(
            auto_wrap_policy, model, what="model_wrapper.auto_wrap_policy"))
        if not units:
            raise ConfigError("strategy 'fsdp': activation_checkpointing without a check_fn "
                              "checkpoints the wrap policy's units, and there are none; set "
                              "check_fn or model_wrapper.auto_wrap_policy")
        chosen = {id(u) for u in units}
        check_fn = lambda module: id(module) in chosen  # noqa: E731
    checkpoint_activations(model, check_fn)
    return model


def load_into_shards(cfg: Any, env: Any, hooks: Any, model: Any) -> Any:
    """``load_from`` into the shards, then refuse parameters nothing initialised.

    A directory is a sharded (DCP) checkpoint: each rank reads its own shards. A
    file is read by rank 0 only, and each rank receives its shard of every
    tensor (``broadcast_from_rank0``), so no rank holds the whole model twice.
    """
    from pathlib import Path

    import torch

    from flexgraph.training.checkpoint_dcp import load_sharded_model_state
    from flexgraph.training.errors import ConfigError
    from flexgraph.training.materialize import uninitialised_parameters
    from flexgraph.training.resume import weights_to_load

    path = weights_to_load(cfg)
    if path is not None:
        runner = hooks.runner
        runner.model = model
        hooks.start_run()
        if Path(path).is_dir():
            missing = load_sharded_model_state(model, Path(path))
            checkpoint: dict[str, Any] = {"meta": {}, "state_dict": {}}
        else:
            checkpoint, missing = _broadcast_full_file(model, path)
        hooks.call("after_load_checkpoint", checkpoint=checkpoint)
        if missing:
            runner.logger.warning(f"load_from {path}: missing keys {list(missing)}")
        runner.logger.info(f"Loaded weights from {path} into the shards")
    bad: list[list[str]] = [[] for _ in range(env.world_size)]
    torch.distributed.all_gather_object(bad, uninitialised_parameters(model))
    names = sorted({name for rank in bad for name in rank})
    if names:
        raise ConfigError(
            f"{len(names)} parameters were never initialised after materialize (e.g. "
            f"{names[0]!r}): their module has no reset_parameters(), the model's init_weights "
            f"did not set them" + (" (skip_init_weights=True)" if path is None else "")
            + ", and load_from did not hold them; give the module a reset_parameters() or "
            "load them from a checkpoint")
    return model


def _broadcast_full_file(model: Any, path: str) -> tuple[dict[str, Any], list[str]]:
    """Rank 0 reads ``path``; every rank loads its shards from rank 0's tensors."""
    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    from flexgraph.training.checkpoint import load_checkpoint_file, weights_in
    from flexgraph.training.errors import CheckpointError

    keys = list(get_model_state_dict(model))  # names only; this rank's shards
    checkpoint, weights, answer = {}, {}, [None, []]
    if torch.distributed.get_rank() == 0:
        try:
            checkpoint = load_checkpoint_file(path)
            weights = {k.removeprefix("module."): v for k, v in weights_in(checkpoint,
                                                                           path).items()}
            matching = [k for k in keys if k in weights]
            if not matching:
                raise CheckpointError(
                    f"none of the {len(weights)} weights in {path!r} match a parameter of "
                    f"{type(model).__name__} (e.g. {next(iter(weights), '?')!r}); is it the "
                    f"right file?")
            weights = {k: weights[k] for k in matching}
            answer[1] = [k for k in keys if k not in weights]
        except Exception as exc:  # every rank must learn it, or the others wait forever
            answer[0] = exc
    torch.distributed.broadcast_object_list(answer, src=0)
    if answer[0] is not None:
        raise answer[0]
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)
    meta = checkpoint.get("meta", {}) if isinstance(checkpoint, dict) else {}
    return {"meta": meta, "state_dict": weights}, answer[1]
