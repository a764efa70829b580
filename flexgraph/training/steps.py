"""The standard training graph's steps, as plain functions.

Each takes its artifacts as keyword arguments named like them, its parameters
keyword-only, and returns one value or a dict of several. They are thin, so a strategy
that replaces a step reuses the same pieces; no step asks which strategy is active.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from flexgraph.core.step import resolve_fn
from flexgraph.training import components
from flexgraph.training.checkpoint import (
    CHECKPOINT_FORMATS,
    Checkpointer,
    FileCheckpointIO,
    FileStateRestorer,
    LoopState,
    PortableCheckpointIO,
    TorchStateAccess,
    load_pretrained,
    load_weights,
)
from flexgraph.training.components import initialise, make_train_step
from flexgraph.training.config import RunSettings, section
from flexgraph.training.errors import ConfigError
from flexgraph.training.loop import (
    Hooks,
    TrainLoop,
    build_evaluator,
    run_evaluation,
)
from flexgraph.training.loop import build_hooks as _build_hooks
from flexgraph.training.output import RunContext, TrainOutput
from flexgraph.training.resume import resume_training
from flexgraph.training.runtime import (
    Env,
    broadcast_buffers,
    broadcast_from_rank0,
    capture_rng,
    follow_source_draws,
    make_env,
    meta_parameters,
    rank0_does,
    restore_rng,
)

__all__ = [
    "build_checkpointer",
    "build_dataloaders",
    "build_hooks",
    "build_model",
    "build_optim_wrapper",
    "build_param_schedulers",
    "build_train_step",
    "compile",
    "init_weights",
    "load_checkpoint",
    "resume",
    "setup_env",
    "test",
    "train",
    "val",
    "wrap_model",
]


def setup_env(cfg: Any, *, device: str | None = None) -> Env:
    """Single-process environment: seed, pick the device (CUDA when available)."""
    return make_env(cfg, device=device)


def build_model(cfg: Any, env: Env, *, device: str | None = None,
                init_context: str | None = None,
                init_options: Mapping[str, Any] | None = None) -> nn.Module:
    """Build ``cfg.model`` through MMEngine's ``MODELS`` registry.

    ``device='meta'`` builds parameters without storage; ``init_context`` is the
    ``"module:attr"`` of a factory ``f(cfg=, env=, **init_options)`` of a context manager
    to build in (``zero.Init``).
    """
    if device != "meta" and init_context is None:
        return _revert_sync_bn_on_cpu(components.build_model_from_cfg(cfg, env, device=device), env)
    before = capture_rng()
    try:
        model = components.build_model_from_cfg(cfg, env, device=device,
                                                init_context=init_context,
                                                init_options=init_options)
    finally:
        restore_rng(before)
    return _revert_sync_bn_on_cpu(model, env)


def _revert_sync_bn_on_cpu(model: nn.Module, env: Env) -> nn.Module:
    """SyncBatchNorm layers cannot sync on a CPU process group: BatchNorm, with a warning."""
    if env.world_size < 2 or str(env.device).startswith("cuda"):
        return model
    names = [name for name, module in model.named_modules()
             if type(module).__name__ == "SyncBatchNorm"]  # torch's and mmcv's
    if not names:
        return model
    if env.rank == 0:
        import warnings

        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        warnings.warn(f"SyncBatchNorm layers ({names[0]!r}{more}) cannot sync on a CPU process "
                      f"group: converted to BatchNorm (MMEngine's revert_sync_batchnorm), "
                      f"each rank normalising by its own batch; run on GPUs to sync them",
                      UserWarning, stacklevel=2)
    from mmengine.model import revert_sync_batchnorm

    return revert_sync_batchnorm(model)


def init_weights(env: Env, model: nn.Module) -> nn.Module:
    """Run the model's own ``init_weights()`` if it has one; a failed initialiser fails
    the run, where MMEngine would only log it."""
    unmade = meta_parameters(model)
    if unmade:
        raise ConfigError(
            f"init_weights: {len(unmade)} parameters are still on the meta device "
            f"(e.g. {unmade[0]!r}); initialising them would do nothing. The step that "
            f"gives them storage (a strategy's materialize) must run before init_weights")
    initialise(model, load_pretrained=load_pretrained)
    return model


def init_from_record(cfg: Any, env: Env, model: nn.Module, *, place: str,
                     whole: Sequence[str] = (), source_rank: int = 0) -> nn.Module:
    """``init_weights`` for a model no rank holds whole: a one-device run's weights.

    ``source_rank`` records the one-device setup without values and sends it to every rank;
    ``place`` (``"module:attr"``), called as ``place(env, model, record, source_rank)``,
    puts each rank's part in place.
    """
    import torch

    def record() -> Any:
        made = components.record_one_device_setup(cfg, env, load_pretrained=load_pretrained,
                                                  whole=tuple(whole))
        names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        odd = sorted(names ^ set(made.params))
        if odd:
            raise ConfigError(
                f"init_weights: parameter {odd[0]!r} is in the "
                f"{'model built for the run' if odd[0] in names else 'one-device setup'} "
                f"only; init_weights must write into the parameters the constructors made "
                f"(nn.init.*_(module.weight), weight.data.copy_(...)), not add or replace them")
        return made

    made = rank0_does(record, share_result=False, rank=source_rank)
    shared = broadcast_from_rank0(None if made is None else made.portable(), rank=source_rank)
    resolve_fn(place)(env, model, shared if made is None else made, source_rank)
    drawn, initialised = shared.drawn, shared.initialised
    del shared
    if made is not None:
        buffers = dict(model.named_buffers())
        values = made.values([name for name in made.buffers if name in buffers])
        with torch.no_grad():
            for name, value in values.items():
                buffers[name].copy_(value)
        restore_rng(made.drawn.rng)
    del made
    broadcast_buffers(model, rank=source_rank)
    for name in initialised:
        model.get_submodule(name)._is_init = True
    if env.rank != source_rank:
        follow_source_draws(drawn, diff_rank_seed=env.diff_rank_seed,
                            warn=env.rank == (1 if source_rank == 0 else 0))
    return model


def build_hooks(cfg: Any, settings: RunSettings, run_context: RunContext) -> Hooks:
    """``custom_hooks`` (+ non-builtin ``default_hooks``) and the runner view they see."""
    return _build_hooks(cfg, settings, run_context)


def build_checkpointer(settings: RunSettings, run_context: RunContext, env: Env, *,
                       io: str | None = None,
                       io_options: Mapping[str, Any] | None = None,
                       access: str | None = None, checkpoint_format: str = "native"
                       ) -> Checkpointer:
    """A checkpointer for ``work_dir`` following ``default_hooks.checkpoint``.

    ``io`` and ``access`` are the ``"module:attr"`` of the strategy's own ``CheckpointIO``
    and ``StateAccess``; ``checkpoint_format='portable'`` writes the portable layout.
    """
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise ConfigError(f"checkpoint_format={checkpoint_format!r}: use one of "
                          f"{', '.join(map(repr, CHECKPOINT_FORMATS))}")
    own = resolve_fn(io)(**dict(io_options or {})) if io else FileCheckpointIO()
    state_access = resolve_fn(access)() if access else TorchStateAccess()
    async_save = settings.checkpoint.async_save
    if async_save and checkpoint_format != "portable":
        raise ConfigError("default_hooks.checkpoint.async_save needs the portable format: "
                          "set the strategy's checkpoint_format='portable'")
    portable = PortableCheckpointIO(state_access, weights=own, async_save=async_save,
                                    plan=run_context.plan)
    writer = portable if checkpoint_format == "portable" else own
    restorers = [own, portable, FileStateRestorer(state_access)]
    return Checkpointer(settings.work_dir, settings.checkpoint, rank=env.rank, io=writer,
                        restorers=[r for r in restorers if r is not writer])


def load_checkpoint(settings: RunSettings, run_context: RunContext, hooks: Hooks,
                    model: nn.Module, checkpointer: Checkpointer, *,
                    pretrained: Sequence[Mapping[str, Any]] = ()) -> nn.Module:
    """Load ``load_from`` weights through the checkpointer's IO, which the strategy
    configures: this step stays the same for every strategy."""
    return load_weights(checkpointer, settings.weights_to_load(), model, hooks,
                        logger=run_context.logger, pretrained=pretrained)


def wrap_model(env: Env, model: nn.Module) -> nn.Module:
    """Move the model to ``env.device``: the whole of wrapping for one device."""
    return model.to(env.device)


def compile(  # noqa: A001 (the public step name; shadows the builtin in this module only)
    model: nn.Module, *, options: Mapping[str, Any] | None = None
) -> nn.Module:
    """``torch.compile`` the model in place, so it keeps its type, ``train_step`` and keys."""
    model.compile(**dict(options or {}))
    return model


def build_dataloaders(cfg: Any, settings: RunSettings, env: Env) -> dict[str, Any]:
    """``train_dataloader`` / ``val_dataloader`` / ``test_dataloader`` (``None`` if absent)."""
    return components.build_dataloaders(cfg, env, stop_signals=settings.stop.signals)


def build_optim_wrapper(cfg: Any, env: Env, model: nn.Module) -> Any:
    """MMEngine optimizer wrapper from ``cfg.optim_wrapper`` (AMP, accumulation, clipping)."""
    return components.build_optim_wrapper(cfg, model, device=env.device)


def build_param_schedulers(cfg: Any, settings: RunSettings, optim_wrapper: Any,
                           train_dataloader: Any) -> Any:
    """MMEngine parameter schedulers from ``cfg.param_scheduler`` (maybe empty)."""
    return components.build_param_schedulers(cfg, settings, optim_wrapper, train_dataloader)


def build_train_step(env: Env, model: nn.Module, optim_wrapper: Any) -> Any:
    """The function the loop calls on every batch: forward, backward, optimizer step."""
    return make_train_step(model, optim_wrapper, env.device)


def resume(settings: RunSettings, run_context: RunContext, model: nn.Module, optim_wrapper: Any,
           param_schedulers: Any, checkpointer: Checkpointer, hooks: Hooks,
           train_dataloader: Any) -> LoopState:
    """Restore model, optimizer, schedulers, position and RNG as ``resume`` asks."""
    return resume_training(settings=settings, model=model, optim_wrapper=optim_wrapper,
                           param_schedulers=param_schedulers, checkpointer=checkpointer,
                           hooks=hooks, train_dataloader=train_dataloader,
                           plan=run_context.plan, logger=run_context.logger,
                           message_hub=run_context.message_hub)


def _output(settings: RunSettings, run_context: RunContext, env: Env, hooks: Hooks,
            **schedule: Any) -> TrainOutput:
    log_dir = run_context.log_dir or settings.work_dir
    return TrainOutput(work_dir=settings.work_dir, is_main=env.is_main,
                       logger=run_context.logger, message_hub=run_context.message_hub,
                       log_interval=settings.logger.interval, device=env.device,
                       visualizer=hooks.built_visualizer(),
                       vis_dir=str(Path(log_dir) / "vis_data"),
                       timestamp=run_context.timestamp, log_processor=settings.logger.processor,
                       metric_by_epoch=settings.logger.metric_by_epoch,
                       progress=run_context.launch.progress, **schedule)


def train(cfg: Any, settings: RunSettings, run_context: RunContext, env: Env, model: nn.Module,
          train_step: Any, optim_wrapper: Any, param_schedulers: Any, train_dataloader: Any,
          val_dataloader: Any, checkpointer: Checkpointer, hooks: Hooks,
          loop_state: LoopState) -> dict[str, Any]:
    """Run the training loop; returns the final metrics (loss, lr, ``val/*``)."""
    if train_dataloader is None:
        raise ConfigError("train needs a train_dataloader in the config")
    schedule = settings.train_schedule(components.epoch_length_of(train_dataloader))
    evaluator = None
    if val_dataloader is not None:
        evaluator = build_evaluator(section(cfg, "val_evaluator"))
    hooks.hold(model=model, optim_wrapper=optim_wrapper, param_schedulers=param_schedulers,
               train_dataloader=train_dataloader, val_dataloader=val_dataloader,
               val_evaluator=evaluator, seed=env.rank_seed, schedule=schedule)
    if hasattr(optim_wrapper, "message_hub"):
        optim_wrapper.message_hub = run_context.message_hub  # grad norms land in this run's hub
    output = _output(settings, run_context, env, hooks, max_iters=schedule.max_iters,
                     max_epochs=schedule.max_epochs, by_epoch=schedule.by_epoch,
                     epoch_length=schedule.epoch_length)
    logging = settings.logger
    loop = TrainLoop(schedule=schedule, env=env, model=model, train_step=train_step,
                     optim_wrapper=optim_wrapper,
                     param_schedulers=param_schedulers, train_dataloader=train_dataloader,
                     val_dataloader=val_dataloader, val_evaluator=evaluator,
                     checkpointer=checkpointer, hooks=hooks, output=output,
                     log_interval=logging.interval, log_ignore_last=logging.ignore_last,
                     state=loop_state, stop_policy=settings.stop)
    return loop.run()


def _evaluate(mode: str, cfg: Any, settings: RunSettings, run_context: RunContext, env: Env,
              model: nn.Module, dataloader: Any, hooks: Hooks) -> dict[str, Any]:
    if dataloader is None:
        raise ConfigError(f"{mode} needs a {mode}_dataloader in the config")
    evaluator = build_evaluator(section(cfg, f"{mode}_evaluator"), what=f"{mode}_evaluator")
    hooks.hold(model=model, **{f"{mode}_dataloader": dataloader, f"{mode}_evaluator": evaluator})
    output = _output(settings, run_context, env, hooks, max_iters=0, max_epochs=0, by_epoch=True,
                     epoch_length=0, interactive=False)
    output.open(0)
    try:
        hooks.start_run()
        metrics = run_evaluation(mode=mode, model=model, dataloader=dataloader,
                                 evaluator=evaluator, hooks=hooks, env=env)
        output.eval_metrics(metrics, mode=mode, iters_done=0, epoch=0)
        hooks.end_run()
    finally:
        output.close()
    return dict(metrics)


def val(cfg: Any, settings: RunSettings, run_context: RunContext, env: Env, model: nn.Module,
        val_dataloader: Any, hooks: Hooks) -> dict[str, Any]:
    """Entry point: one validation pass (``val_evaluator``, else mean loss)."""
    return _evaluate("val", cfg, settings, run_context, env, model, val_dataloader, hooks)


def test(cfg: Any, settings: RunSettings, run_context: RunContext, env: Env, model: nn.Module,
         test_dataloader: Any, hooks: Hooks) -> dict[str, Any]:
    """Entry point: one test pass (``test_evaluator``, else mean loss)."""
    return _evaluate("test", cfg, settings, run_context, env, model, test_dataloader, hooks)


test.__test__ = False  # a step, not a pytest test, when imported into a test module
