"""Hybrid sharding (FSDP2 on a 2-D mesh) over two "nodes" of two CPU processes each.

Two ``flexgraph run --nproc-per-node 2 --nnodes 2`` launchers, one per node
rank, meet at one rendezvous, as on two machines: four gloo ranks. The mesh
comes from the launch (2 nodes x 2 processes): each node holds the model
sharded over its two ranks, and the two nodes are replicas of each other, so
after training rank 0 and rank 2 (and rank 1 and rank 3) hold equal shards.
Four ranks on a small machine are costly, so the run is a handful of iterations.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.cli.cli_helpers import ROOT, write_config

pytestmark = pytest.mark.slow

HYBRID = """
train_cfg = dict(by_epoch=False, max_iters=4, val_interval=1000)
val_cfg = None
val_dataloader = None
val_evaluator = None
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1000, by_epoch=False),
                     logger=dict(type='LoggerHook', interval=1))
strategy = dict(type='FSDPStrategy', model_wrapper=dict(sharding_strategy='HYBRID_SHARD'))
custom_imports = dict(imports=['digits', 'killer', 'shards'], allow_failed_imports=False)
custom_hooks = [dict(type='Shards')]
"""

SHARDS = textwrap.dedent(
    '''
    """Test-only hook: each rank writes its mesh, placements and local shards after training."""
    import json
    import os

    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS


    @HOOKS.register_module(force=True)
    class Shards(Hook):
        def after_train(self, runner):
            params = list(runner.model.parameters())
            info = {"mesh": list(params[0].device_mesh.shape),
                    "placements": sorted({str(p.placements) for p in params}),
                    "local": [p.to_local().flatten().tolist() for p in params]}
            with open(os.path.join(runner.work_dir, f"shards-rank{runner.rank}.json"), "w") as f:
                json.dump(info, f)
    '''
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hybrid_shard_replicates_across_nodes_and_shards_within_one(tmp_path):
    config = write_config(tmp_path, extra=HYBRID)
    (tmp_path / "shards.py").write_text(SHARDS)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples"), "OMP_NUM_THREADS": "1"}
    port = str(_free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir", "work",
         "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", str(node),
         "--master-addr", "127.0.0.1", "--master-port", port],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    assert "fully_shard: hybrid mesh 2 x 2" in outputs[0][0]

    ranks = [json.loads((tmp_path / "work" / f"shards-rank{r}.json").read_text())
             for r in range(4)]
    assert all(r["mesh"] == [2, 2] for r in ranks)
    assert ranks[0]["placements"] == ["(Replicate(), Shard(dim=0))"]
    assert ranks[0]["local"] == ranks[2]["local"] and ranks[1]["local"] == ranks[3]["local"]
    assert ranks[0]["local"] != ranks[1]["local"]  # two halves of the model, not copies
