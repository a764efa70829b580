"""Setup's host memory in the estimate: what each strategy's ranks hold before the optimizer.

The figures are checked against what ranks measure in
``tests/cli/test_zero3_setup_cli.py`` (4 processes); here, what each memory model
says, and ``--strategy auto`` refusing a candidate whose setup does not fit a node.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from flexgraph.training.estimate._census import take_census


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 48)
        self.blocks = nn.Sequential(*(nn.Linear(48, 48) for _ in range(3)))
        self.head = nn.Linear(48, 7)


def _setup(module: str, device: str = "cpu", loaded: bool = False, world: int = 4, **options):
    from importlib import import_module

    census = take_census(_Model())
    memory = import_module(f"flexgraph.strategies.{module}")
    return census, memory.estimate_setup(census, world_size=world, target_device=device,
                                         weights_loaded=loaded, **options)


def test_single_and_ddp_hold_the_whole_model_on_every_rank() -> None:
    census, single = _setup("single_device_memory")
    assert single.rank0 == single.others == census.param_bytes
    _, ddp_gpu = _setup("ddp_memory", "cuda")
    assert ddp_gpu.rank0 == ddp_gpu.others == census.param_bytes
    _, ddp_cpu = _setup("ddp_memory")  # the buckets are host memory on a CPU run
    assert ddp_cpu.others == census.param_bytes + 4 * census.trainable
    _, views = _setup("ddp_memory", model_wrapper={"gradient_as_bucket_view": True})
    assert views.others == census.param_bytes
    _, loaded = _setup("ddp_memory", "cuda", loaded=True)  # DDP initialises all the same
    assert loaded.others == census.param_bytes


def test_zero3_partitions_and_no_rank_holds_the_model() -> None:
    fp32 = {"zero_optimization": {"stage": 3}}
    census, cpu = _setup("deepspeed.memory", config=fp32)
    partitions = census.total * 4 // 4
    assert cpu.rank0 == cpu.others == partitions + 4 * max(census.largest_layer,
                                                           2 * census.largest_param)
    _, loaded = _setup("deepspeed.memory", loaded=True, config=fp32)
    assert loaded.rank0 == loaded.others == partitions + 4 * census.largest_layer
    _, gpu = _setup("deepspeed.memory", "cuda", config=fp32)  # partitions are the GPU's
    assert (gpu.rank0, gpu.others) == (0, 0)
    _, bf16 = _setup("deepspeed.memory", config={**fp32, "bf16": {"enabled": True}})
    assert bf16.rank0 == bf16.others == census.total * 2 // 4 + 2 * max(
        census.largest_layer, 2 * census.largest_param)  # zero.Init builds in bf16
    _, zero2 = _setup("deepspeed.memory", config={"zero_optimization": {"stage": 2}})
    assert zero2.rank0 == zero2.others == census.param_bytes


def test_fsdp_shards_plus_one_parameter_in_flight_and_no_rank_holds_the_model() -> None:
    census, fsdp = _setup("fsdp.memory")  # no wrap policy: the root is the only unit
    assert fsdp.rank0 == fsdp.others == census.total * 4 // 4 + 2 * 4 * census.largest_param
    _, loaded = _setup("fsdp.memory", loaded=True)  # one unit's rows read at a time
    assert loaded.rank0 == loaded.others == census.total * 4 // 4 + census.total * 4
    _, gpu = _setup("fsdp.memory", "cuda")
    assert gpu.rank0 == gpu.others == 2 * 4 * census.largest_param


def test_a_node_holds_rank_0_and_its_other_ranks() -> None:
    from flexgraph.training.estimate import SetupMemory

    assert SetupMemory(rank0=10, others=3).node(8) == 10 + 7 * 3
    assert SetupMemory(rank0=10, others=3).node(1) == 10


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexgraph", "plan", *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_plan_estimate_gives_setup_per_rank_and_its_verdict(tiny_vit) -> None:
    done = _plan(str(tiny_vit), "--compare", "ddp,deepspeed:zero3", "--world-size", "8",
                 "--nproc-per-node", "4", "--device-memory", "16GB", "--host-memory", "1GB",
                 "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["host_memory"] == {"bytes": 10**9, "source": "--host-memory 1GB",
                                     "margin": 0.1, "processes_per_node": 4}
    ddp, zero3 = (row["setup"] for row in report["candidates"])
    whole = report["parameters"]["bytes"]
    assert ddp["rank0_bytes"] == ddp["other_bytes"] == whole
    assert ddp["node_bytes"] == 4 * whole and ddp["fits"] is True
    assert (zero3["rank0_bytes"], zero3["other_bytes"]) == (0, 0)  # on GPUs: no rank whole
    table = _plan(str(tiny_vit), "--compare", "ddp,deepspeed:zero3", "--world-size", "8",
                  "--device-memory", "16GB", "--host-memory", "1GB")
    text = " ".join(table.stdout.split())
    assert "setup's host memory (MB), 8 rank(s) per node" in text


@pytest.mark.slow
def test_strategy_auto_refuses_a_candidate_whose_setup_does_not_fit_the_node(tiny_vit) -> None:
    """8 ranks on one node of 120 MB: the whole model on every rank (DDP, ZeRO-1/2) does not
    fit, FSDP's (no rank whole) does."""
    done = _plan(str(tiny_vit), "--strategy", "auto", "--world-size", "8",
                 "--device-memory", "16GB", "--host-memory", "120MB", "--format", "json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["strategy"] == "fsdp"
    reason = plan["estimate"]["auto"]["reason"]
    assert "refused for their setup: ddp: its setup needs" in reason
    assert "deepspeed:zero2: its setup needs" in reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks train on this machine's GPUs")
def test_strategy_auto_on_host_memory_alone_refuses_when_no_setup_fits(tiny_vit) -> None:
    """Without a GPU the ranks train in the node's memory, ZeRO-3's partitions too: with 10 MB
    for 8 ranks no candidate's setup fits. (On GPUs ZeRO-3 sets up with nothing on the host.)"""
    nothing = _plan(str(tiny_vit), "--strategy", "auto", "--world-size", "8",
                    "--host-memory", "10MB")
    assert nothing.returncode == 2, nothing.stdout
    assert "every strategy that fits the device was refused for its setup" in nothing.stderr
    assert "--host-memory" in nothing.stderr


@pytest.mark.slow
@pytest.mark.parametrize("size", ["lots", "12XB"])
def test_a_host_memory_that_is_no_size_is_refused_naming_the_flag(tiny_vit, size) -> None:
    done = _plan(str(tiny_vit), "--estimate", "--host-memory", size)
    assert done.returncode == 2
    assert f"--host-memory {size!r} is not a size" in done.stderr
