"""Hand-written DeepSpeed ZeRO-3 setup, the two ways a DeepSpeed user sets it up.

Plain torch, MMEngine and DeepSpeed, launched as ``python -m torch.distributed.run
--nproc-per-node 4 --standalone benchmarks/_setup_hand_deepspeed.py --blocks B
--width W --work-dir D --way WAY``:

* ``whole``, as MMEngine's DeepSpeedStrategy does: every rank builds the whole
  model and runs its ``init_weights()`` (MMEngine's ``init_cfg``), seeded alike,
  and ``deepspeed.initialize`` partitions it;
* ``zero-init``, as DeepSpeed's tutorials do: the model is built under
  ``deepspeed.zero.Init`` (partitioned as it is built), and ``init_weights()``
  runs on rank 0 inside ``deepspeed.zero.GatheredParameters(every parameter,
  modifier_rank=0)``, which gathers the whole model on every rank and
  partitions rank 0's values when it ends.

Then ``deepspeed.initialize`` with torch's AdamW (no C++ optimizer compiled),
and the first batch's loss through the engine. Each rank writes its record to D.
These rows measure what DeepSpeed itself costs, against which the flexgraph
ZeRO-3 rows' time is read.
"""

from __future__ import annotations

import deepspeed
import torch
from _setup_workload import (
    BATCH,
    LR,
    SetupBenchModel,
    SetupRecord,
    hand_arguments,
    hand_first_loss,
    leave,
    seed_like_flexgraph,
)

WAYS = ("whole", "zero-init")


def main() -> None:
    args = hand_arguments(__doc__.splitlines()[0], ways=WAYS)
    # as flexgraph's DeepSpeed steps do: no shared-memory all-reduce op, which only
    # tensor parallelism calls and whose build takes about 40 s, once per environment
    builder = deepspeed.accelerator.get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world_size = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 1 << 30}
    record = SetupRecord(args.work_dir, rank)
    seed_like_flexgraph()
    if args.way == "whole":
        model = SetupBenchModel(args.blocks, args.width)
        model.init_weights()
    else:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = SetupBenchModel(args.blocks, args.width)
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            if rank == 0:
                model.init_weights()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    hand_first_loss(engine, args.width, rank, world_size, record)
    leave(deepspeed.comm.barrier, deepspeed.comm.destroy_process_group)


if __name__ == "__main__":
    main()
