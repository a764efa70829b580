"""What a user writes to put a setup step where each bug put it, for ``flexgraph run``.

Imported through a config's ``custom_imports``: it registers strategies that
are the built-in ones plus the user's rewrite (``bug_<name>``), and holds the
user's step functions.
"""

from __future__ import annotations

from typing import Any

from flexgraph import Configure, Insert, Step, get_strategy, register_strategy

HERE = __name__


def bf16_on_source(env: Any, model: Any) -> Any:
    """Rank 0's whole copy in bf16 (the snapshot taken before the upcast), the others fp32."""
    import torch

    return model.to(torch.bfloat16) if env.rank == 0 else model


def upcast(model: Any) -> Any:
    """The fp32 upcast of the model."""
    return model.float()


def load_into(model: Any, *, path: str) -> Any:
    """The user's own load: the file into the model this step receives, non-strict."""
    import torch

    model.load_state_dict(torch.load(path)["state_dict"], strict=False)
    return model


USER_REWRITES = {
    # load_from through the plain file IO, past DeepSpeed's engine and its master copies
    "megatron_bridge_3397": ("deepspeed", {"zero_optimization": {"stage": 1}},
                             Configure("build_checkpointer", {"io": None, "access": None})),
    # the model built before (outside) ZeRO-3's zero.Init
    "roblox_fai_rl_66": ("deepspeed", {"zero_optimization": {"stage": 3}},
                         Configure("build_model", {"init_context": None})),
    # rank 0's copy in another dtype than the others' before fully_shard
    "accelerate_4021": ("fsdp", {}, Insert(Step(
        "snapshot_dtype", f"{HERE}:bf16_on_source", requires="env", updates="model",
        before="fully_shard"), after="build_model")),
    # every rank builds (loads) the whole model though the strategy builds it on meta
    "ms_swift_9982": ("fsdp", {}, Configure("build_model", {"device": None})),
}

for _bug, (_base, _options, _rewrite) in USER_REWRITES.items():
    register_strategy(f"bug_{_bug}", lambda _b=_base, _o=_options, _r=_rewrite, **options:
                      get_strategy(_b, **{**_o, **options}).then(_r))
