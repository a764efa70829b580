"""The standard training graph, with the public step names of docs/design.rst.

Declared order (ties in a plan follow it):

    setup_env -> build_model -> init_weights -> [build_hooks, build_checkpointer]
      -> load_checkpoint -> wrap_model -> [compile] -> build_dataloaders
      -> build_optim_wrapper -> build_param_schedulers -> build_train_step
      -> resume -> train

``init_weights``, ``load_checkpoint``, ``wrap_model`` (and ``compile``) all
update ``model``; that chain is what strategies rearrange. Everything that reads
the model (the optimizer, resume, the loop) runs after the whole chain.

The seams strategies use instead of branching: ``build_model`` takes a device
(``'meta'`` included) and an init context; ``build_checkpointer`` takes the
checkpoint IO, through which ``load_checkpoint`` loads and ``resume`` restores,
so a strategy that shards the model configures the IO and keeps both steps;
``build_train_step`` makes the function the loop calls every
iteration, so an engine that owns backward and step replaces that one step.

Functions are referenced as ``"module:attr"`` text, so planning this graph does
not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flexgraph.core.graph import Graph
from flexgraph.core.step import Step

if TYPE_CHECKING:
    from flexgraph.training.config import RunSettings
    from flexgraph.training.output import RunContext

STEPS = "flexgraph.training.steps"

# The config, the settings read from it once, and what the run knows beyond its config
# (the plan, the work_dir's record, the launch: see standard_inputs).
INPUTS = ("cfg", "settings", "run_context")

LOOP_INPUTS = (
    "cfg",
    "settings",
    "run_context",
    "env",
    "model",
    "train_step",
    "optim_wrapper",
    "param_schedulers",
    "train_dataloader",
    "val_dataloader",
    "checkpointer",
    "hooks",
    "loop_state",
)


def _step(name: str, doc: str, **fields: Any) -> Step:
    return Step(name=name, fn=f"{STEPS}:{name}", doc=doc, **fields)


ENTRIES = ("train", "val", "test")


def standard_graph(cfg: Mapping[str, Any] | None = None, entry: str = "train") -> Graph:
    """The training graph for ``cfg`` (``compile=True`` in it adds ``compile``).

    ``entry`` picks the last step: ``train`` (the loop), or ``val`` / ``test``
    (one evaluation pass). An evaluation graph still holds every setup step;
    plan it with ``targets=(entry,)`` to keep only what the pass needs once the
    strategy has rewritten the graph (see :func:`flexgraph.make_plan`).

    Parameters
    ----------
    cfg : mapping, optional
        The run's config; only ``compile`` is read here (``True``, or a dict of
        ``torch.compile`` options bound to the ``compile`` step).
    entry : {"train", "val", "test"}, optional

    Returns
    -------
    Graph
        Steps whose functions are ``"flexgraph.training.steps:<name>"``
        references, with ``cfg``, ``settings`` and ``run_context`` as inputs
        (:func:`standard_inputs` makes all three).

    Raises
    ------
    ValueError
        ``entry`` is none of the three.

    Examples
    --------
    >>> standard_graph().names[:3]
    ('setup_env', 'build_model', 'init_weights')
    >>> standard_graph(entry="val").names[-1]
    'val'
    """
    if entry not in ENTRIES:
        raise ValueError(f"entry must be one of {ENTRIES}, not {entry!r}")
    cfg = cfg or {}
    steps = [
        _step("setup_env", "seed, pick the device", requires="cfg", provides="env"),
        _step("build_model", "build cfg.model", requires=("cfg", "env"), provides="model"),
        _step("init_weights", "model.init_weights() when it has one", requires="env",
              updates="model"),
        _step("build_hooks", "default and custom hooks",
              requires=("cfg", "settings", "run_context"), provides="hooks"),
        _step(
            "build_checkpointer",
            "where and how often to save",
            requires=("settings", "run_context", "env"),
            provides="checkpointer",
        ),
        _step(
            "load_checkpoint",
            "load_from: weights only",
            requires=("settings", "run_context", "hooks", "checkpointer"),
            updates="model",
        ),
        _step("wrap_model", "move the model to its device", requires="env", updates="model"),
    ]
    if cfg.get("compile"):
        options = cfg["compile"] if isinstance(cfg["compile"], Mapping) else {}
        steps.append(
            _step("compile", "torch.compile", updates="model", params={"options": dict(options)})
        )
    steps += [
        _step(
            "build_dataloaders",
            "train/val/test loaders",
            requires=("cfg", "settings", "env"),
            provides=("train_dataloader", "val_dataloader", "test_dataloader"),
        ),
        _step(
            "build_optim_wrapper",
            "optimizer in mmengine's OptimWrapper",
            requires=("cfg", "env", "model"),
            provides="optim_wrapper",
        ),
        _step(
            "build_param_schedulers",
            "LR and momentum schedulers",
            requires=("cfg", "settings", "optim_wrapper", "train_dataloader"),
            provides="param_schedulers",
        ),
        _step(
            "build_train_step",
            "forward, backward, optimizer step",
            requires=("env", "model", "optim_wrapper"),
            provides="train_step",
        ),
        _step(
            "resume",
            "restore the full training state",
            requires=(
                "settings",
                "run_context",
                "model",
                "optim_wrapper",
                "param_schedulers",
                "checkpointer",
                "hooks",
                "train_dataloader",
            ),
            provides="loop_state",
        ),
    ]
    if entry == "train":
        steps.append(
            _step("train", "the training loop", requires=LOOP_INPUTS, provides="train_result")
        )
        return Graph.of(steps, inputs=INPUTS)
    evaluate = _step(
        entry,
        f"one {entry} pass",
        requires=("cfg", "settings", "run_context", "env", "model", f"{entry}_dataloader",
                  "hooks"),
        provides=f"{entry}_result",
    )
    # Not cut here: a strategy rewrites the whole graph first, then the plan keeps
    # what ``entry`` needs (``make_plan(..., targets=(entry,))``).
    return Graph.of([*steps, evaluate], inputs=INPUTS)


def standard_inputs(cfg: Any, run_context: RunContext | None = None, *,
                    settings: RunSettings | None = None) -> dict[str, Any]:
    """The standard graph's inputs: ``cfg``, its :class:`RunSettings` read once, the run context.

    Reading the settings here, before the plan runs, is what makes a
    contradictory config, or a path the run could not use, fail before any
    step has built anything.

    Parameters
    ----------
    cfg : mmengine.Config or mapping
        The run's config.
    run_context : RunContext, optional
        What the run knows beyond its config (its plan, its record and log, the
        launch: :class:`~flexgraph.training.output.RunContext`). ``flexgraph
        run`` passes its own; the default is this process alone: no plan, no
        record, a console logger at the config's ``log_level`` (a portable
        checkpoint's manifest then records no plan).
    settings : RunSettings, optional
        ``cfg``'s, already read and checked (``flexgraph run`` reads them before
        it plans); by default read here.

    Returns
    -------
    dict
        ``{"cfg": ..., "settings": ..., "run_context": ...}``.

    Raises
    ------
    ConfigError
        A section of ``cfg`` that :func:`~flexgraph.training.config.read_settings`
        refuses, or a ``work_dir`` that is a file.
    CheckpointNotFoundError
        ``load_from`` or ``resume`` names a path that does not exist
        (:func:`~flexgraph.training.config.check_paths`).
    """
    # mmengine's registries: not for plan
    from flexgraph.training.config import check_paths, read_settings
    from flexgraph.training.output import RunContext

    if settings is None:
        settings = read_settings(cfg)
        check_paths(settings)
    if run_context is None:
        run_context = RunContext.of_this_process(log_level=settings.log_level,
                                                 log_dir=settings.work_dir)
    return {"cfg": cfg, "settings": settings, "run_context": run_context}
