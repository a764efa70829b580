"""Hand-written DeepSpeed training of the memory benchmark's model.

Plain torch and DeepSpeed, launched as ``python -m torch.distributed.run
--nproc-per-node 2 --standalone benchmarks/_memory_hand_deepspeed.py --iters N
--work-dir D --ds-config C.json``, as DeepSpeed's tutorials do it: for ZeRO
stage 3 the model is built under ``deepspeed.zero.Init`` (partitioned as it is
built), then ``deepspeed.initialize`` with torch's AdamW (so no C++ optimizer
is compiled) and the JSON config as given; the engine owns backward and step.
Each rank writes its record to D.
"""

from __future__ import annotations

import json
from pathlib import Path

import deepspeed
import torch
import torch.nn.functional as F
from _memory_workload import (
    LR,
    WEIGHT_DECAY,
    RankRecorder,
    ResidualMLP,
    join_group,
    leave_group,
    rank_batches,
    script_arguments,
)


def main() -> None:
    args = script_arguments(__doc__.splitlines()[0], "--ds-config")
    config = json.loads(Path(args.ds_config).read_text())
    rank, world_size, device = join_group(deepspeed.init_distributed)

    stage = config.get("zero_optimization", {}).get("stage", 0)
    with deepspeed.zero.Init(config_dict_or_path=config, enabled=stage == 3):
        model = ResidualMLP(args.blocks, args.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    recorder = RankRecorder(args.work_dir, rank, world_size, device)
    for inputs, labels in rank_batches(args.iters, args.width, rank, world_size, device):
        loss = F.cross_entropy(engine(inputs), labels)
        engine.backward(loss)
        engine.step()
        recorder.iteration_done()
    recorder.write()
    leave_group(deepspeed.comm.barrier, deepspeed.comm.destroy_process_group)


if __name__ == "__main__":
    main()
