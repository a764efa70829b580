"""Hand-written FSDP2 setup the way MMEngine's FSDPStrategy sets up: every rank whole.

Plain torch and MMEngine, launched as ``python -m torch.distributed.run
--nproc-per-node 4 --standalone benchmarks/_setup_hand_mmengine.py --blocks B
--width W --work-dir D``: every rank builds the whole model on the CPU and runs
its ``init_weights()`` (MMEngine's ``init_cfg``), seeded alike, so the ranks
hold the same weights; then ``fully_shard`` on every block and on the root,
torch's AdamW, and the first batch's loss. Each rank writes its record to D.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _setup_workload import (
    LR,
    SetupBenchModel,
    SetupRecord,
    block_units,
    hand_arguments,
    hand_first_loss,
    leave,
    seed_like_flexgraph,
)
from torch.distributed.fsdp import fully_shard


def main() -> None:
    args = hand_arguments(__doc__.splitlines()[0])
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    record = SetupRecord(args.work_dir, rank)
    seed_like_flexgraph()
    model = SetupBenchModel(args.blocks, args.width)
    model.init_weights()
    for block in block_units(model):
        fully_shard(block)
    fully_shard(model)
    torch.optim.AdamW(model.parameters(), lr=LR)  # built, as the flexgraph rows build it
    hand_first_loss(model, args.width, rank, world_size, record)
    leave(dist.barrier, dist.destroy_process_group)


if __name__ == "__main__":
    main()
