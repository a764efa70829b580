"""A small training-shaped graph and a strategy that uses every kind of rewrite.

The base graph is the standard setup sequence; the strategy ``demo``:

1. inserts ``freeze_backbone`` after ``init_weights``;
2. moves ``load_checkpoint`` after ``wrap_model`` (a sharded load);
3. replaces ``wrap_model`` with ``shard_model`` (a new name);
4. fuses ``build_optim_wrapper`` and ``build_param_schedulers`` into ``build_optim``;
5. configures ``build_model`` with ``device="meta"``;
6. removes ``resume``.

Functions are ``"module:attr"`` text: planning never imports them.
"""

from __future__ import annotations

from flexgraph import (
    Configure,
    Fuse,
    Graph,
    Insert,
    Move,
    Remove,
    Replace,
    Step,
    Strategy,
)


def base_graph() -> Graph:
    return Graph.of(
        [
            Step("setup_env", "demo.steps:setup_env", requires="cfg", provides="env"),
            Step(
                "build_model", "demo.steps:build_model", requires=("cfg", "env"), provides="model"
            ),
            Step("init_weights", "demo.steps:init_weights", updates="model"),
            Step("load_checkpoint", "demo.steps:load_checkpoint", requires="cfg", updates="model"),
            Step("wrap_model", "demo.steps:wrap_model", updates="model"),
            Step(
                "build_optim_wrapper",
                "demo.steps:build_optim_wrapper",
                requires=("cfg", "model"),
                provides="optim_wrapper",
            ),
            Step(
                "build_param_schedulers",
                "demo.steps:build_param_schedulers",
                requires=("cfg", "optim_wrapper"),
                provides="param_schedulers",
            ),
            Step("resume", "demo.steps:resume", requires="cfg", updates="optim_wrapper"),
            Step(
                "train",
                "demo.steps:train",
                requires=("model", "optim_wrapper", "param_schedulers"),
                params={"max_epochs": 2},
            ),
        ],
        inputs=["cfg"],
    )


def demo_strategy() -> Strategy:
    return Strategy(
        "demo",
        [
            Insert(
                Step("freeze_backbone", "demo.steps:freeze_backbone", updates="model"),
                after="init_weights",
            ),
            Move("load_checkpoint", after="wrap_model"),
            Replace("wrap_model", Step("shard_model", "demo.steps:shard_model", updates="model")),
            Fuse(("build_optim_wrapper", "build_param_schedulers"), "build_optim"),
            Configure("build_model", {"device": "meta"}),
            Remove("resume"),
        ],
    )
