"""Hand-written FSDP2 training of the memory benchmark's model.

Plain torch, launched as ``python -m torch.distributed.run --nproc-per-node 2
--standalone benchmarks/_memory_hand_fsdp.py --iters N --work-dir D``, the way
FSDP2 is meant to be used: the model built on the meta device (no rank ever
holds all of it), ``fully_shard`` on every block and then on the root,
materialised with ``to_empty`` and only then initialised, torch's AdamW over
the sharded parameters. Each rank writes its record to D.
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
from torch.distributed.fsdp import fully_shard


def main() -> None:
    args = script_arguments(__doc__.splitlines()[0])
    rank, world_size, device = join_group(dist.init_process_group)

    with torch.device("meta"):
        model = ResidualMLP(args.blocks, args.width)
    for block in model.blocks:  # one all-gather per block: only one block is ever whole
        fully_shard(block)
    fully_shard(model)  # the rest (final norm, head) in the root's group
    model.to_empty(device=device)
    model.reset_parameters()
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
