"""Hand-written DDP training of the memory benchmark's model (the baseline row).

Plain torch, launched as ``python -m torch.distributed.run --nproc-per-node 2
--standalone benchmarks/_memory_hand_ddp.py --iters N --work-dir D``: the model
built on every rank, wrapped in DistributedDataParallel, trained with torch's
AdamW. Each rank writes its record (peak memory, iteration stamps) to D.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _memory_workload import (
    LR,
    SEED,
    WEIGHT_DECAY,
    RankRecorder,
    ResidualMLP,
    bench_device,
    rank_batches,
    script_arguments,
)
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    args = script_arguments(__doc__.splitlines()[0])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = bench_device(int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(SEED)

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
    # Leave together, then skip the interpreter's teardown, where gloo's threads can
    # abort a finished rank (pytorch/pytorch#190489), as flexgraph's ranks do.
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
