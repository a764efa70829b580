"""The standard training graph's steps, as plain functions.

Each step takes its input artifacts as keyword arguments (named exactly like the
artifacts) and its parameters as keyword-only arguments with defaults, and
returns its output: one value, or a dict when it provides several artifacts.
They are thin on purpose: the work lives in the modules they call, so a
strategy that replaces a step can reuse the same pieces.

Three inputs come from outside: ``cfg``, whose component configs steps build;
``settings``, the :class:`~flexgraph.training.config.RunSettings` read from
it once before the plan runs (schedule, checkpoint, logger and stop policies,
the work_dir, what to load and resume), so no step reads those sections
itself; and ``run_context``, the :class:`~flexgraph.training.output.RunContext`
(the plan being run, the run's logger, timestamp, folder and message hub, the
launch's facts), which the steps that need any of it take as an argument.
Steps show hooks the artifacts through ``hooks.hold`` and read nothing back
from the hooks' runner view (a test checks it).

No step asks which strategy is active. Whatever differs between single-device
and distributed runs comes from ``env`` (built by the strategy's process setup)
and, below the steps, from :mod:`flexgraph.training.runtime`'s process-group
helpers (``this_rank``, ``world_size``, ``rank0_does``).

:mod:`flexgraph.training.graph` declares what each step requires, provides and
updates; a test checks that every declared step matches its function here.
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
    SourceDraws,
    broadcast_from_rank0,
    drawn_by,
    follow_source_draws,
    make_env,
    meta_parameters,
    rank0_does,
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
                init_options: Mapping[str, Any] | None = None,
                source_rank: int | None = None) -> nn.Module:
    """Build ``cfg.model`` through MMEngine's ``MODELS`` registry.

    Parameters
    ----------
    device
        ``None`` builds on the CPU (``wrap_model`` moves the model to
        ``env.device`` later, after weights are loaded); ``'meta'`` builds the
        parameters without storage (buffers stay real), for strategies that
        shard before any weight exists; any other device builds there.
    init_context
        ``"module:attr"`` of a factory ``f(cfg=, env=, **init_options)`` returning
        a context manager to build the model in (DeepSpeed's ``zero.Init``
        partitions parameters as they are created).
    source_rank
        The rank that builds the model whole, on the CPU, as a one-device run
        builds it (its constructors draw the same random numbers), for the
        others: they build with ``device`` (``'meta'``), and the strategy hands
        them their part of the source's weights later. Their generators then
        stand where they would had they built it whole (:func:`_follow_source`).
        ``None``: every rank builds with ``device``.
    """
    if source_rank is None or env.rank != source_rank:
        model = components.build_model_from_cfg(cfg, env, device=device,
                                                init_context=init_context,
                                                init_options=init_options)
        if source_rank is not None:
            _follow_source(env, source_rank, None)
        return model
    model, drawn = drawn_by(lambda: components.build_model_from_cfg(
        cfg, env, device=None, init_context=None, init_options=init_options))
    _follow_source(env, source_rank, drawn)
    return model


def _follow_source(env: Env, source_rank: int, drawn: SourceDraws | None) -> None:
    """Every rank's generators where a DDP rank's would be after what ``source_rank`` did
    for all (``drawn``, given there; a collective): its states, or under
    ``randomness.diff_rank_seed`` this rank's own, advanced by the same draws."""
    drawn = broadcast_from_rank0(drawn, rank=source_rank)
    if env.rank != source_rank:
        follow_source_draws(drawn, diff_rank_seed=env.diff_rank_seed,
                            warn=env.rank == (1 if source_rank == 0 else 0))


def init_weights(env: Env, model: nn.Module, *, source_rank: int | None = None) -> nn.Module:
    """Run the model's own ``init_weights()`` (MMEngine ``BaseModule``) if it has one.

    An initialiser that fails fails the run (see :func:`initialise`), where
    MMEngine would only log it. A ``Pretrained`` ``init_cfg`` loads its
    checkpoint as ``load_from`` loads a whole model's weights (see
    :func:`~flexgraph.training.checkpoint.load_pretrained`).

    ``source_rank``: only that rank initialises, the one that built the model
    whole (``build_model``'s ``source_rank``); the others hold parameters on
    the meta device, which the strategy fills from it afterwards. A failure
    there is raised on every rank. The others' random generators then stand
    where a DDP rank's would after ``init_weights``: the source's states, or
    under ``randomness.diff_rank_seed`` their own, advanced by the draws the
    source made (:func:`~flexgraph.training.runtime.follow_source_draws`), so
    that training's dropout draws what it draws under DDP.
    """
    if source_rank is not None:
        # what the source drew (shapes, a few bytes each) goes to every rank, not the model
        drawn = rank0_does(lambda: drawn_by(lambda: _initialise(model))[1],
                           share_result=False, rank=source_rank)
        _follow_source(env, source_rank, drawn)
        return model
    return _initialise(model)


def _initialise(model: nn.Module) -> nn.Module:
    unmade = meta_parameters(model)
    if unmade:
        raise ConfigError(
            f"init_weights: {len(unmade)} parameters are still on the meta device "
            f"(e.g. {unmade[0]!r}); initialising them would do nothing. The step that "
            f"gives them storage (a strategy's materialize) must run before init_weights")
    initialise(model, load_pretrained=load_pretrained)
    return model


def build_hooks(cfg: Any, settings: RunSettings, run_context: RunContext) -> Hooks:
    """``custom_hooks`` (+ non-builtin ``default_hooks``) and the runner view they see,
    which logs through the run context's logger."""
    return _build_hooks(cfg, settings, run_context)


def build_checkpointer(settings: RunSettings, run_context: RunContext, env: Env, *,
                       io: str | None = None,
                       io_options: Mapping[str, Any] | None = None,
                       access: str | None = None, checkpoint_format: str = "native"
                       ) -> Checkpointer:
    """A checkpointer for ``work_dir`` following ``default_hooks.checkpoint``.

    ``io`` is the ``"module:attr"`` of the strategy's own
    :class:`~flexgraph.training.checkpoint.CheckpointIO` class, built with
    ``io_options`` (default: one file per checkpoint); ``access`` that of its
    :class:`~flexgraph.training.checkpoint.StateAccess` (default: torch's
    ``state_dict`` API). ``checkpoint_format='portable'`` writes the portable
    layout instead of the own one (in the background with
    ``default_hooks.checkpoint.async_save=True``); its manifests record
    ``run_context.plan``. Either way the run restores its own format, the
    portable one and one-file checkpoints, whichever strategy wrote them.
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
    """Load ``load_from`` weights through the checkpointer's IO.

    The strategy configures the IO (``Configure('build_checkpointer', io=...)``),
    which knows how weights go into the model it manages; this step stays the
    same for every strategy.

    ``pretrained``: the ``init_cfg`` ``Pretrained`` files to load first, each
    into its module (``path``, ``module``, ``prefix``). A run binds them when
    its files cover the model and ``init_weights`` is pruned (a derived
    rewrite, :func:`~flexgraph.training.checkpoint.derive_from_weights`).
    """
    return load_weights(checkpointer, settings.weights_to_load(), model, hooks,
                        logger=run_context.logger, pretrained=pretrained)


def wrap_model(env: Env, model: nn.Module) -> nn.Module:
    """Move the model to ``env.device``: the whole of wrapping for one device.

    Distributed strategies replace this step with their own wrapper (DDP's is
    ``flexgraph.strategies.ddp:wrap_ddp``); no step here looks at the world size.
    """
    return model.to(env.device)


def compile(  # noqa: A001 (the public step name; shadows the builtin in this module only)
    model: nn.Module, *, options: Mapping[str, Any] | None = None
) -> nn.Module:
    """``torch.compile`` the model in place (the optional ``compile`` step).

    ``options`` are ``torch.compile``'s keyword arguments (``backend``, ``mode``,
    ``fullgraph``, ``dynamic``, ...). In place (``nn.Module.compile``) rather than
    wrapping, so the model keeps its type, its ``train_step`` and its
    state-dict keys.
    """
    model.compile(**dict(options or {}))
    return model


def build_dataloaders(cfg: Any, settings: RunSettings, env: Env) -> dict[str, Any]:
    """``train_dataloader`` / ``val_dataloader`` / ``test_dataloader`` (``None`` if absent).

    Their workers leave the run's stop signals to the main process.
    """
    return components.build_dataloaders(cfg, env, stop_signals=settings.stop.signals)


def build_optim_wrapper(cfg: Any, env: Env, model: nn.Module) -> Any:
    """MMEngine optimizer wrapper from ``cfg.optim_wrapper`` (AMP, accumulation, clipping)."""
    return components.build_optim_wrapper(cfg, model, device=env.device)


def build_param_schedulers(cfg: Any, settings: RunSettings, optim_wrapper: Any,
                           train_dataloader: Any) -> Any:
    """MMEngine parameter schedulers from ``cfg.param_scheduler`` (maybe empty).

    A list, or for an ``OptimWrapperDict`` a dict of lists by optimizer name,
    as MMEngine's Runner builds them.
    """
    return components.build_param_schedulers(cfg, settings, optim_wrapper, train_dataloader)


def build_train_step(env: Env, model: nn.Module, optim_wrapper: Any) -> Any:
    """The function the loop calls on every batch: forward, backward, optimizer step.

    Returns what the loop logs for the batch. The default runs a step-API model's
    ``train_step(batch, optim_wrapper)`` or a plain model's forward and the
    wrapper's ``update_params``; a strategy whose engine owns backward and step
    replaces this step.
    """
    return make_train_step(model, optim_wrapper, env.device)


def resume(settings: RunSettings, run_context: RunContext, model: nn.Module, optim_wrapper: Any,
           param_schedulers: Any, checkpointer: Checkpointer, hooks: Hooks,
           train_dataloader: Any) -> LoopState:
    """Restore model, optimizer, schedulers, position and RNG as ``resume`` asks.

    What changed since the checkpoint's plan is logged against ``run_context.plan``.
    """
    return resume_training(settings=settings, model=model, optim_wrapper=optim_wrapper,
                           param_schedulers=param_schedulers, checkpointer=checkpointer,
                           hooks=hooks, train_dataloader=train_dataloader,
                           plan=run_context.plan, logger=run_context.logger,
                           message_hub=run_context.message_hub)


def _output(settings: RunSettings, run_context: RunContext, env: Env, hooks: Hooks,
            **schedule: Any) -> TrainOutput:
    """The run's output, through the run context's log; the hooks' visualizer, if built,
    gets its scalars (and it closes it)."""
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
