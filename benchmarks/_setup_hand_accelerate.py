"""Hand-written FSDP2 setup the way Accelerate's ``cpu_ram_efficient_loading`` does it.

Plain torch and MMEngine, launched as ``python -m torch.distributed.run
--nproc-per-node 4 --standalone benchmarks/_setup_hand_accelerate.py --blocks B
--width W --work-dir D``, after Accelerate's ``fsdp2_prepare_model`` and
``fsdp2_load_full_state_dict``: rank 0 alone builds the model and runs its
``init_weights()`` (MMEngine's ``init_cfg``) and keeps its full state dict;
every rank's model goes to the meta device; ``fully_shard`` on every block and
on the root; then, one parameter at a time, rank 0 broadcasts the whole tensor
(the others receive it into a buffer of its full size), every rank cuts its
shard out of it (``distribute_tensor``), and the shards go in with
``load_state_dict(assign=True)``. Then torch's AdamW and the first batch's loss. Each
rank writes its record to D.
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
from torch.distributed.tensor import distribute_tensor


def main() -> None:
    args = hand_arguments(__doc__.splitlines()[0])
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    record = SetupRecord(args.work_dir, rank)
    seed_like_flexgraph()
    full = None
    if rank == 0:
        model = SetupBenchModel(args.blocks, args.width)
        model.init_weights()
        full = model.state_dict()
        model = model.to(torch.device("meta"))
    else:
        with torch.device("meta"):
            model = SetupBenchModel(args.blocks, args.width)
    for block in block_units(model):
        fully_shard(block)
    fully_shard(model)
    sharded = {}
    for name, meta in model.state_dict().items():
        whole = full[name].detach() if rank == 0 else torch.empty(meta.size(), dtype=meta.dtype)
        dist.broadcast(whole, src=0)
        sharded[name] = distribute_tensor(whole, meta.device_mesh, meta.placements)
        del whole
    full = None
    model.load_state_dict(sharded, assign=True)
    torch.optim.AdamW(model.parameters(), lr=LR)  # built, as the flexgraph rows build it
    hand_first_loss(model, args.width, rank, world_size, record)
    leave(dist.barrier, dist.destroy_process_group)


if __name__ == "__main__":
    main()
