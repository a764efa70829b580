"""``LiveBytes`` on real tensors: what a sharded model holds is counted once, by its shards."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# One real gloo rank (a process group of one, in its own process: DTensor needs a mesh).
FSDP_STEP = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from flexgraph.training.estimate._live_bytes import LiveBytes

    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    counter = LiveBytes(real=True)
    with counter:
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.randn(8, 256)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        counter._recount()
        local = sum(p.to_local().nbytes for p in model.parameters())
        print(counter.live, local)
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_fsdp2_dtensors_count_their_local_shards_not_their_global_size(tmp_path) -> None:
    """FSDP2's parameters and AdamW's states are DTensors, whose own storage has the
    global size and holds nothing: after a step the live bytes are the shards of the
    parameters and of AdamW's two states (3x the parameters at one rank), not more."""
    done = subprocess.run([sys.executable, "-c", FSDP_STEP, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    live, local = (int(v) for v in done.stdout.split())
    # AdamW's step counters (one small tensor per parameter) are all that may come on top
    assert 3 * local <= live < 3 * local + 1024, (live, local)


def test_a_real_run_leaves_meta_tensors_out_and_a_traced_step_counts_them() -> None:
    """DeepSpeed keeps a meta tensor per parameter (its shapes): no memory in a real run."""
    import torch

    from flexgraph.training.estimate._live_bytes import LiveBytes

    for real, expected in ((True, 4 * 1024), (False, 4 * 1024 + 4 * 2**20)):
        with LiveBytes(real=real) as counter:
            kept = [torch.zeros(1024), torch.zeros(2**20, device="meta")]
        assert counter.live == expected, (real, counter.live)
        del kept
