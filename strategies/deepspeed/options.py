"""The DeepSpeed strategy's options: MMEngine's keys as one DeepSpeed config, checked.

Plan time: no DeepSpeed or torch import; what only the run knows is filled in by
:func:`flexgraph.strategies.deepspeed.engine.fill_config`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flexgraph.strategies.common import refuse
from flexgraph.strategies.names import DEEPSPEED

from flexgraph.core.strategy import StrategyOptionError

__all__ = ["amp_sections", "deepspeed_config", "plan_notes", "precision", "wrapper_options"]

_AUTO_KEYS = {0: (), 1: ("reduce_bucket_size", "allgather_bucket_size"),
              2: ("reduce_bucket_size", "allgather_bucket_size"),
              3: ("reduce_bucket_size", "stage3_prefetch_bucket_size",
                  "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size")}


def _refuse(key: str, why: str) -> StrategyOptionError:
    return refuse(DEEPSPEED.name, key, why)


def _base_config(config: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config)))
    path = Path(config)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise _refuse(f"config={str(path)!r}", "does not exist") from None
    except json.JSONDecodeError as exc:
        raise _refuse(f"config={str(path)!r}", f"is not JSON: {exc}") from None


def precision(config: Mapping[str, Any]) -> str:
    """The one precision ``config`` enables: ``'fp16'``, ``'bf16'``, ``'amp'`` or ``'fp32'``."""
    enabled = [name for name in ("fp16", "bf16", "amp")
               if isinstance(config.get(name), Mapping) and config[name].get("enabled")]
    if len(enabled) > 1:
        raise _refuse(f"{' and '.join(enabled)}", "are both enabled; choose one precision")
    return enabled[0] if enabled else "fp32"


def _check_hierarchical(zero: Mapping[str, Any], stage: int) -> None:
    """ZeRO++ hpZ (``zero_hpz_partition_size``): stage 3's parameters also kept per node."""
    hpz = zero.get("zero_hpz_partition_size", 1)
    if hpz == 1:
        return
    if hpz != "auto" and not (isinstance(hpz, int) and hpz > 1):
        raise _refuse(f"zero_optimization.zero_hpz_partition_size={hpz!r}",
                      "must be a whole number of ranks, or 'auto' (the processes per node)")
    if stage != 3:
        raise _refuse(f"zero_optimization.zero_hpz_partition_size={hpz!r}",
                      f"partitions stage 3's parameters within a node (ZeRO++ hpZ); it "
                      f"needs zero_optimization.stage=3, not {stage}")


def deepspeed_config(config: str | Mapping[str, Any] | None = None,
                     **keys: Any) -> dict[str, Any]:
    """A copy of ``config`` (a dict or a JSON file) with ``keys`` over it, checked.

    MMEngine's ``zero_optimization.cpu_offload`` becomes ``offload_optimizer``; unset ZeRO
    bucket sizes become ``'auto'``; a key given ``None`` leaves ``config``'s value.
    """
    merged = _base_config(config)
    merged.update({k: json.loads(json.dumps(v)) for k, v in keys.items() if v is not None})
    zero = dict(merged.get("zero_optimization") or {})
    if zero.pop("cpu_offload", False):
        zero.setdefault("offload_optimizer", {"device": "cpu"})
    stage = zero.setdefault("stage", 0)
    if stage not in _AUTO_KEYS:
        raise _refuse(f"zero_optimization.stage={stage!r}", "must be 0, 1, 2 or 3")
    _check_hierarchical(zero, stage)
    for key in _AUTO_KEYS[stage]:
        zero.setdefault(key, "auto")
    merged["zero_optimization"] = zero
    merged.setdefault("steps_per_print", 10**12)  # DeepSpeed's own progress lines: off
    precision(merged)
    return merged


#: what a DeepSpeed run takes of an ``optim_wrapper`` (the rest become DeepSpeed config keys)
_TAKEN = frozenset({"type", "optimizer", "paramwise_cfg", "constructor", "clip_grad",
                    "accumulative_counts"})
_WRAPPERS = ("OptimWrapper", "DeepSpeedOptimWrapper", "AmpOptimWrapper")
#: torch's GradScaler defaults, which an AmpOptimWrapper's dynamic scaling starts from
_SCALER = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5,
           "growth_interval": 2000}


def _wrapper_type(optim_cfg: Mapping[str, Any]) -> str:
    kind = optim_cfg.get("type", "OptimWrapper")
    return str(getattr(kind, "__name__", kind)).rpartition(".")[2]


def wrapper_options(optim_cfg: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The ``optim_wrapper`` options DeepSpeed's wrapper takes, and the keys dropped.

    An AmpOptimWrapper's ``dtype`` and ``loss_scale`` become DeepSpeed's precision.
    """
    kind = _wrapper_type(optim_cfg)
    if kind not in _WRAPPERS:
        raise _refuse(f"optim_wrapper.type={kind!r}", "does not apply: DeepSpeed does "
                      "precision, clipping and accumulation itself; use "
                      "type='DeepSpeedOptimWrapper' and the strategy's fp16/bf16 keys")
    translated = {"dtype", "loss_scale"} if kind == "AmpOptimWrapper" else set()
    dropped = sorted(set(optim_cfg) - _TAKEN - translated)
    return {k: v for k, v in optim_cfg.items() if k in _TAKEN}, dropped


def amp_sections(optim_cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """An ``AmpOptimWrapper``'s precision as DeepSpeed's ``bf16`` / ``fp16`` section, or ``{}``.

    DeepSpeed scales only from a power of 2, doubling and halving.
    """
    if _wrapper_type(optim_cfg) != "AmpOptimWrapper":
        return {}
    dtype = str(optim_cfg.get("dtype") or "float16").rpartition(".")[2]
    if dtype == "bfloat16":
        return {"bf16": {"enabled": True}}
    if dtype not in ("float16", "half"):
        raise _refuse(f"optim_wrapper.dtype={dtype!r}", "must be 'float16' or 'bfloat16'")
    scale = optim_cfg.get("loss_scale", "dynamic")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return {"fp16": {"enabled": True, "loss_scale": float(scale)}}
    options = {**_SCALER, **(scale if isinstance(scale, Mapping) else {})}
    power = math.log2(options["init_scale"]) if options["init_scale"] > 0 else 0.5
    if (scale != "dynamic" and not isinstance(scale, Mapping)) or set(options) - set(_SCALER) \
            or (options["growth_factor"], options["backoff_factor"]) != (2.0, 0.5) \
            or not power.is_integer():
        raise _refuse(f"optim_wrapper.loss_scale={scale!r}", "DeepSpeed scales dynamically "
                      "from a power of 2, doubling and halving: give 'dynamic', a number, "
                      "or dict(init_scale=2.**N, growth_interval=...)")
    return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": int(power),
                     "loss_scale_window": int(options["growth_interval"]), "hysteresis": 1}}


def plan_notes(cfg: Any, strategy: Any) -> dict[str, str]:
    """What ``deepspeed_initialize`` makes of an ``AmpOptimWrapper``: DeepSpeed's section."""
    sections = amp_sections(dict(cfg.get("optim_wrapper") or {}))
    if not sections or precision(strategy.memory_options["config"]) != "fp32":
        return {}
    (name, amp), = sections.items()
    return {"deepspeed_initialize": f"optim_wrapper's AmpOptimWrapper becomes DeepSpeed's "
                                    f"{name}: {json.dumps(amp)}"}
