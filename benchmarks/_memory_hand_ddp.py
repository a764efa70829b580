"""Hand-written DDP training of the memory benchmark's model (the baseline row).

Plain torch, launched as ``python -m torch.distributed.run --nproc-per-node 2
--standalone benchmarks/_memory_hand_ddp.py --iters N --work-dir D``: the model
built on every rank, wrapped in DistributedDataParallel, trained with torch's
AdamW. Each rank writes its record (peak memory, iteration stamps) to D.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
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
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    args = script_arguments(__doc__.splitlines()[0])
    rank, world_size, device = join_group(dist.init_process_group)

    model = ResidualMLP(args.blocks, args.width).to(device)
    model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    recorder = RankRecorder(args.work_dir, rank, world_size, device)
    for inputs, labels in rank_batches(args.iters, args.width, rank, world_size, device):
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        recorder.iteration_done()
    recorder.write()
    leave_group(dist.barrier, dist.destroy_process_group)


if __name__ == "__main__":
    main()
