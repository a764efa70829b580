"""The memory benchmark's workload in plain torch: the model, the data, what each rank records.

Both sides of ``memory.py`` import this module: flexgraph's ranks through
``_memory_mmengine.py`` (which wraps the model in MMEngine's ``BaseModel`` and
registers everything), and the hand-written scripts ``_memory_hand_*.py``
directly. So every row trains the same layers on the same rows, and every rank,
whoever launched it, measures with the same :class:`RankRecorder`.

The model is a stack of residual MLP blocks (pre-LayerNorm, ``width -> 4 width
-> width``) and a classification head: 20 blocks of width 1280 hold 264 M
parameters, so that parameters, gradients and AdamW's two moments (about 1 GiB
each in fp32) dominate a rank's memory and the blocks give FSDP and ZeRO-3
something to shard one at a time. Activations are small (a batch of 16 rows).
This module imports torch only.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import nn

BLOCKS, WIDTH, CLASSES = 20, 1280, 1000
BATCH = 16  # rows per rank and iteration
LR, WEIGHT_DECAY = 1e-4, 0.01  # AdamW, in the config and in the hand-written scripts
SEED = 0
MEMORY_AFTER_ITERS = 5  # peak memory is read after this many iterations
RECORD_NAME = "membench-rank{rank}.json"
LIVE_BYTES_VAR = "MEMBENCH_LIVE_BYTES"
"""Set (to 1) in a row's environment: its ranks count live tensor bytes (``memory.py
--estimate``). A dispatch mode sees every operator, so only the untimed rows set it."""
_live_bytes: Any = None


def track_live_bytes() -> None:
    """Count this process's live tensor bytes from now on, when :data:`LIVE_BYTES_VAR` is set.

    Called when this module is imported, which a flexgraph rank does while it
    loads its config (``custom_imports``), before any step has made a tensor;
    the mode counts every storage an operator creates from then on (those that
    C++ code makes too, DDP's gradient buckets included) until it is freed.
    """
    global _live_bytes
    if os.environ.get(LIVE_BYTES_VAR) and _live_bytes is None:
        from flexgraph.training.estimate._live_bytes import LiveBytes

        _live_bytes = LiveBytes(real=True)
        _live_bytes.__enter__()


class ResidualBlock(nn.Module):
    """``x + W2 gelu(W1 norm(x))``: the unit that FSDP and ZeRO-3 gather one at a time."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    """``blocks`` residual blocks and a linear head: ``forward(inputs) -> logits``."""

    def __init__(self, blocks: int = BLOCKS, width: int = WIDTH, classes: int = CLASSES) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = inputs
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def reset_parameters(self) -> None:
        """(Re-)initialise every layer: what a model built on the meta device needs
        once it has been materialised (``to_empty``) to hold real values."""
        for module in self.modules():
            if module is not self and callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()


def parameter_count(blocks: int, width: int, classes: int = CLASSES) -> int:
    """Parameters of ``ResidualMLP(blocks, width, classes)`` (built on the meta device)."""
    with torch.device("meta"):
        return sum(p.numel() for p in ResidualMLP(blocks, width, classes).parameters())


def block_parameter_count(width: int) -> int:
    """Parameters of one block: the size a size-based wrap policy must reach to wrap it."""
    with torch.device("meta"):
        return sum(p.numel() for p in ResidualBlock(width).parameters())


class SyntheticRows(torch.utils.data.Dataset):
    """``n`` seeded random rows of ``width`` features and a class label each.

    Items are ``{'inputs': tensor[width], 'labels': tensor[]}``, identical in every
    process (the samplers pick each rank's share).
    """

    def __init__(self, n: int, width: int = WIDTH, classes: int = CLASSES,
                 seed: int = SEED) -> None:
        g = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(n, width, generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.metainfo: dict[str, Any] = {}  # MMEngine's dataloader code reads it

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.inputs[i], "labels": self.labels[i]}


def bench_device(local_rank: int) -> torch.device:
    """This rank's device: its own GPU when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def join_group(init: Callable[[str], Any]) -> tuple[int, int, torch.device]:
    """Join the launched group with ``init(backend)``; this rank's (rank, world size, device)."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = bench_device(int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(SEED)
    return rank, world_size, device


def leave_group(barrier: Callable[[], Any], destroy: Callable[[], Any]) -> NoReturn:
    """Leave together, then skip the interpreter's teardown, where gloo's threads can
    abort a finished rank (pytorch/pytorch#190489), as flexgraph's ranks do."""
    barrier()
    destroy()
    sys.stdout.flush()
    os._exit(0)


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak memory so far, in MiB.

    On a GPU, what torch's caching allocator handed out at most
    (``torch.cuda.max_memory_allocated``, never reset, so since process start);
    on the CPU, the process's peak resident set size (``ru_maxrss``, which the
    kernel keeps from process start on).
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes there, KiB here


def memory_kind(device: torch.device) -> str:
    return "cuda max_memory_allocated" if device.type == "cuda" else "peak RSS (ru_maxrss)"


class RankRecorder:
    """What one rank measures: the time at the end of each iteration, and its peak
    memory after :data:`MEMORY_AFTER_ITERS` iterations; written as JSON to
    ``work_dir/membench-rank<R>.json`` by :meth:`write`.

    The flexgraph runs call :meth:`iteration_done` from an ``after_train_iter``
    hook, the hand-written scripts at the end of their loop body, so the period
    between two stamps is one whole iteration on both sides (fetching the batch,
    forward, backward, optimizer step and whatever the loop does around them).
    Each stamp holds two clocks: wall time, and the process's CPU time (all its
    threads), which other processes on a shared machine disturb much less. On a
    GPU each stamp waits for the device first.
    """

    def __init__(self, work_dir: str | os.PathLike[str], rank: int, world_size: int,
                 device: torch.device) -> None:
        self.path = Path(work_dir) / RECORD_NAME.format(rank=rank)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.stamps: list[float] = []
        self.cpu_stamps: list[float] = []
        self.peak_mib: float | None = None
        self.live_peak_mib: float | None = None
        self.start_live_mib: float | None = None

    def iteration_done(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())
        if len(self.stamps) == 1 and _live_bytes is not None:
            _live_bytes._recount()
            self.start_live_mib = _live_bytes.live / 2**20
            _live_bytes.peak = _live_bytes.live  # the steady state from here on
        if len(self.stamps) == MEMORY_AFTER_ITERS:
            self.peak_mib = peak_memory_mib(self.device)
            if _live_bytes is not None:
                self.live_peak_mib = _live_bytes.peak / 2**20

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({
            "rank": self.rank, "world_size": self.world_size, "device": str(self.device),
            "threads": torch.get_num_threads(), "memory_kind": memory_kind(self.device),
            "peak_mib": self.peak_mib, "live_peak_mib": self.live_peak_mib,
            "live_after_first_iter_mib": self.start_live_mib,
            "iterations": len(self.stamps), "stamps": self.stamps,
            "cpu_stamps": self.cpu_stamps,
        }))


# -- what the hand-written scripts share ------------------------------------------------


def script_arguments(description: str, *extra: str) -> Any:
    """The hand-written scripts' command line: ``--blocks --width --iters --work-dir``
    (plus ``extra`` flags, each taking a string)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--iters", type=int, required=True, help="iterations to train")
    parser.add_argument("--work-dir", required=True, help="where the rank records go")
    for flag in extra:
        parser.add_argument(flag, required=True)
    return parser.parse_args()


def rank_batches(iters: int, width: int, rank: int, world_size: int,
                 device: torch.device) -> Any:
    """This rank's ``iters`` batches of :data:`BATCH` rows, as ``(inputs, labels)`` on
    ``device``: a DistributedSampler over one pass of :class:`SyntheticRows`."""
    dataset = SyntheticRows(iters * BATCH * world_size, width)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                                  shuffle=True, seed=SEED)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                         drop_last=True)
    for batch in loader:
        yield batch["inputs"].to(device), batch["labels"].to(device)


track_live_bytes()
