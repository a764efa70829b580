"""The standard training graph, with the public step names of docs/design.rst.

Declared order (ties in a plan follow it):

    setup_env -> build_model -> init_weights -> [build_hooks, build_checkpointer]
      -> load_checkpoint -> wrap_model -> [compile] -> build_dataloaders
      -> build_optim_wrapper -> build_param_schedulers -> build_train_step
      -> resume -> train

``init_weights``, ``load_checkpoint``, ``wrap_model`` (and ``compile``) all update
``model``: that chain is what strategies rearrange. The seams strategies use instead of
branching: ``build_model``'s device and init context, ``build_checkpointer``'s IO, and
``build_train_step``. Functions are ``"module:attr"`` text, so planning imports no torch.
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
CONTRACTS = "flexgraph.training.contracts"
NO_META = f"{CONTRACTS}:no_meta_parameters"
OPTIMIZER_HOLDS_MODEL = f"{CONTRACTS}:optimizer_holds_model"
WEIGHTS_AS_READ = f"{CONTRACTS}:weights_as_read"

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

    ``entry`` picks the last step: ``train`` (the loop), or ``val`` / ``test`` (one
    evaluation pass, whose graph still holds every setup step: plan it with
    ``targets=(entry,)`` to keep what the pass needs once the strategy has rewritten it).

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
        _step("build_model", "build cfg.model", requires=("cfg", "env"), provides="model",
              gives=("whole", "unwrapped")),
        _step("init_weights", "model.init_weights() when it has one", requires="env",
              updates="model", gives="initialised"),
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
            gives="loaded",
            contracts=(NO_META, WEIGHTS_AS_READ),
        ),
        _step("wrap_model", "move the model to its device", requires="env", updates="model",
              gives="on_device", contracts=NO_META),
    ]
    if cfg.get("compile"):
        options = cfg["compile"] if isinstance(cfg["compile"], Mapping) else {}
        steps.append(
            _step("compile", "torch.compile", updates="model", params={"options": dict(options)},
                  gives="compiled")
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
            contracts=OPTIMIZER_HOLDS_MODEL,
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
    return Graph.of([*steps, evaluate], inputs=INPUTS)


def standard_inputs(cfg: Any, run_context: RunContext | None = None, *,
                    settings: RunSettings | None = None) -> dict[str, Any]:
    """The standard graph's inputs: ``cfg``, its :class:`RunSettings` read once, the run context.

    Read before the plan runs, so a bad config fails before any step has built anything.
    Without ``run_context``: this process alone (no plan, no record, a console logger).
    """
    # imports mmengine's registries, which planning does not need
    from flexgraph.training.config import check_paths, read_settings
    from flexgraph.training.output import RunContext

    if settings is None:
        settings = read_settings(cfg)
        check_paths(settings)
    if run_context is None:
        run_context = RunContext.of_this_process(log_level=settings.log_level,
                                                 log_dir=settings.work_dir)
    return {"cfg": cfg, "settings": settings, "run_context": run_context}
