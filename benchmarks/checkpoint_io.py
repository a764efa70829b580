"""How fast does flexgraph's checkpoint IO save and load, against plain torch.save / torch.load?

Every measurement runs in rounds (``_harness.py``): in each round every way,
the baseline included, saves a fresh file and loads it back, in an order
that reverses from one round to the next, after a first round at full size
that is not counted; each ratio is taken against the baseline of the same
round, and the median over rounds is shown:

(a) One process, a model whose state is ``--size-gb`` in ``--tensors`` float32
    parameters: flexgraph's single-file IO (``FileCheckpointIO``: ``torch.save``
    plus fsync; restoring checks every record's CRC-32 over a map of the file,
    maps it with ``torch.load(weights_only=True, mmap=True)`` and copies the
    weights from the map into the model) and its DCP IO
    (``DistributedCheckpointIO``, single-process; it reads into the model's
    own tensors) against ``torch.save`` + fsync, and ``torch.load`` +
    ``load_state_dict``, of the same tensors. The bare ``torch.save`` (no
    fsync: the data may still be in the page cache only) is shown too: it is
    the same save, timed up to its fsync. Goal: at least 0.9x the baseline's
    speed.
(b) Two ranks (gloo, ``torch.distributed.run --standalone``), the same state
    sharded by FSDP2: DCP's sharded save (every rank writes its shards) against
    gathering the full state to rank 0 and ``torch.save`` there (+ fsync).
    Goal: faster.
(c) One process, the same state trained on (every iteration updates every
    parameter in place, as an optimizer step does), saved through the
    :class:`~flexgraph.training.checkpoint.Checkpointer` the checkpoint hook
    uses, in the portable format: how long training is blocked by a save
    with ``default_hooks.checkpoint.async_save=True`` (staging to CPU memory,
    into buffers the first save allocates and the next ones reuse; DCP writes
    and fsyncs in the background) against the same save done
    synchronously (DCP's writer fsyncs every file) and against ``torch.save``
    + fsync. Goal: at most 0.2x. Then how many iterations ran while the
    background write was going on and how much slower they were than the
    steady state (median iteration time before the save).
(d) ``flexgraph ckpt convert``'s memory, each conversion in a fresh process:
    the growth of its anonymous memory (``RssAnon``, sampled every 5 ms; file
    pages mapped for reading are the page cache's, not the process's) and of
    its peak resident set (``VmHWM``, mapped file pages included) over the
    process after its imports, against the checkpoint's size and its largest
    tensor. Goal: bounded by the largest tensor (plus a reader's buffers), not
    the checkpoint.

Dirty pages are synced (untimed) before each save and each load, so no way
pays for another's writeback. Ratios are speeds (baseline time / flexgraph
time: above 1 is faster)::

    python benchmarks/checkpoint_io.py [--size-gb 1] [--tensors 64] [--repeats 5] [--dir D]

A shared disk's speed varies by tens of percent from one save to the next;
``--dir /dev/shm`` (a tmpfs: no disk, fsync does nothing) isolates what the
code costs.

Why the bare save is timed inside the fsync'd one: timed as two saves of
their own, one run here read 2.42 s for the bare save and 0.91 s with the
fsync, which made flexgraph's save read 0.45x of the baseline. A buffered
write's time depends on the page cache it meets (free pages, or pages to
reclaim from other files first; dirty pages of earlier writes still being
written back and throttling new ones), which changes from one save to the
next on a busy machine and is the same for neither of two saves measured
apart. One save, timed at its fsync and at its end, is one write: the bare
row can no longer read slower than the fsync'd one, and each round's ratios
are taken within the round.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _harness import Rounds, interleave, timed  # noqa: E402 (benchmarks/ is sys.path[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="state size (default 1 GB)")
    parser.add_argument("--tensors", type=int, default=64, help="tensors in the state")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per measurement")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--part", choices=("all", "one", "two", "async", "convert"),
                        default="all", help="(a) one process, (b) two ranks, (c) async "
                        "save, (d) convert's memory, or all")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def rows_per_tensor(size_gb: float, tensors: int) -> int:
    """Rows of 1024 float32 per tensor, for ``tensors`` tensors of ``size_gb`` in all."""
    return max(1, int(size_gb * 1e9 / 4 / tensors) // 1024)


class State(torch.nn.Module):
    """``tensors`` float32 parameters of ``size_gb`` in all: the state to checkpoint."""

    def __init__(self, size_gb: float, tensors: int) -> None:
        super().__init__()
        rows = rows_per_tensor(size_gb, tensors)
        generator = torch.Generator().manual_seed(0)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.rand(rows, 1024, generator=generator))
            for _ in range(tensors))


def fsynced_save(obj: object, path: Path) -> float:
    """``torch.save`` + fsync; the seconds until the data were written, before the fsync."""
    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        written = time.perf_counter() - start
        os.fsync(f.fileno())
    return written


def _drop(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def seconds(work: Callable[[], object]) -> float:
    return timed(work).wall


BASELINE = "torch.save + fsync / torch.load"
BARE = "torch.save (no fsync) / torch.load"


def ways_to_checkpoint(model: State, where: Path) -> dict[str, Callable[[], dict[str, float]]]:
    """Each way's one measurement of ``model``'s state: save to a fresh file, load it back.

    Each returns its ``save`` and ``load`` seconds; the baseline also the
    seconds of its save up to the fsync (``write``: the bare save).
    """
    from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO

    from flexgraph.training.checkpoint import FileCheckpointIO

    weights = model.state_dict()
    meta = {"meta": {"iter": 1, "epoch": 0}}
    file_io, dcp_io = FileCheckpointIO(), DistributedCheckpointIO()
    files = itertools.count()

    def torch_save(path: Path) -> dict[str, float]:
        start = time.perf_counter()
        written = fsynced_save({"state_dict": weights, **meta}, path)
        return {"write": written, "save": time.perf_counter() - start}

    def torch_load(path: Path) -> None:
        model.load_state_dict(torch.load(path, weights_only=True)["state_dict"])

    def io_save(io: FileCheckpointIO | DistributedCheckpointIO) -> Callable[[Path], dict]:
        return lambda path: {"save": seconds(
            lambda: io.write({**meta, **io.states(model, None)}, path, model=model))}

    def io_load(io: FileCheckpointIO | DistributedCheckpointIO) -> Callable[[Path], None]:
        return lambda path: io.apply(io.read(path, model=model), path, model=model,
                                     optim_wrapper=None)

    def measure(save: Callable[[Path], dict[str, float]],
                load: Callable[[Path], None]) -> Callable[[], dict[str, float]]:
        def once() -> dict[str, float]:
            path = where / f"one-{next(files)}"  # a fresh file in every round
            os.sync()  # no way pays for the writeback of another's dirty pages
            figures = save(path)
            os.sync()
            figures["load"] = seconds(lambda: load(path))
            _drop(path)
            return figures
        return once

    return {
        BASELINE: measure(torch_save, torch_load),
        "flexgraph FileCheckpointIO": measure(io_save(file_io), io_load(file_io)),
        "flexgraph DistributedCheckpointIO": measure(io_save(dcp_io), io_load(dcp_io)),
    }


def one_process(args: argparse.Namespace, where: Path) -> Rounds:
    """(a): every way's ``save`` and ``load`` seconds in each of ``--repeats`` rounds,
    after a round that warms up; the bare save is the baseline's, up to its fsync."""
    torch.set_num_threads(1)
    rounds = interleave(ways_to_checkpoint(State(args.size_gb, args.tensors), where),
                        args.repeats)
    rounds.values = {BARE: [{"save": r["write"], "load": r["load"]}
                            for r in rounds.values[BASELINE]], **rounds.values}
    return rounds


def two_ranks(args: argparse.Namespace, where: Path) -> tuple[float, float, float] | str:
    """(b): medians of the DCP sharded save and of the gather to rank 0 + torch.save
    seconds on 2 ranks, and of their ratio per round (gathered / sharded); or why not."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--standalone", __file__, "--rank-worker", "--size-gb", str(args.size_gb),
               "--tensors", str(args.tensors), "--repeats", str(args.repeats),
               "--dir", str(where)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    lines = [x for x in done.stdout.splitlines() if x.startswith("TIMES ")]
    if done.returncode != 0 or not lines:
        return f"failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    sharded, gathered, ratio = (float(x) for x in lines[-1].split()[1:4])
    return sharded, gathered, ratio


def _train_step(params: list[torch.Tensor]) -> None:
    """One stand-in training iteration: every parameter changes in place (an SGD step)."""
    with torch.no_grad():
        torch._foreach_mul_(params, 0.999)


def async_save(args: argparse.Namespace, where: Path) -> dict[str, Any]:
    """(c): seconds training is blocked by each way of saving (``Rounds``: ``async``,
    ``sync``, ``torch``, and ``steady``, the median of 5 iterations with no save
    going on), the first async save's, and the iterations the background write
    slowed (``during``: their seconds, over the counted rounds)."""
    from flexgraph.training.checkpoint import Checkpointer, PortableCheckpointIO

    torch.set_num_threads(1)
    model = State(args.size_gb, args.tensors)
    params = list(model.parameters())
    checkpointers = {
        "async": Checkpointer(where / "async", io=PortableCheckpointIO(async_save=True)),
        "sync": Checkpointer(where / "sync", io=PortableCheckpointIO()),
    }
    steps = itertools.count()

    def save(way: str) -> None:
        step, checkpointer = next(steps), checkpointers[way]
        checkpoint = checkpointer.snapshot(model=model, optim_wrapper=None,
                                           param_schedulers=None, epoch=0, iteration=step,
                                           batch_idx=step, seed=0)
        checkpointer.save(checkpoint, f"iter_{step}", model=model)

    def in_background() -> dict[str, Any]:
        blocked = seconds(lambda: save("async"))
        pending = checkpointers["async"]._pending
        background = pending.write.future if pending is not None else None
        during = []
        while background is not None and not background.done():
            during.append(seconds(lambda: _train_step(params)))
        checkpointers["async"].finish_pending()
        return {"blocked": blocked, "during": during}

    def torch_save() -> dict[str, float]:
        path = where / f"plain-{next(steps)}.pth"
        blocked = seconds(lambda: fsynced_save({"state_dict": model.state_dict()}, path))
        _drop(path)
        return {"blocked": blocked}

    warm = Checkpointer(where / "warm", io=PortableCheckpointIO(async_save=True))
    small = State(1e-5, 1)  # first calls pay for imports and thread start-up, not IO
    warm.save(warm.snapshot(model=small, optim_wrapper=None, param_schedulers=None, epoch=0,
                            iteration=0, batch_idx=0, seed=0), "iter_0", model=small)
    warm.finish_pending()
    os.sync()
    first = seconds(lambda: save("async"))  # allocates the staging buffers
    checkpointers["async"].finish_pending()
    rounds = interleave({
        "steady": lambda: statistics.median(seconds(lambda: _train_step(params))
                                            for _ in range(5)),
        "sync": lambda: {"blocked": seconds(lambda: save("sync"))},
        "torch": torch_save,
        "async": in_background,
    }, args.repeats, between=os.sync)
    for name in ("async", "sync", "warm"):
        _drop(where / name)
    return {"rounds": rounds, "first": first,
            "during": [t for r in rounds.series("async", "during") for t in r]}


_CONVERT = """
import re, sys, threading, time
from flexgraph.training.checkpoint_tools import convert_checkpoint

def status(field):
    text = open('/proc/self/status').read()
    return int(re.search(field + r':\\s+(\\d+) kB', text).group(1)) * 1024

base_anon, base_peak, peak_anon, done = status('RssAnon'), status('VmHWM'), [0], []
def sample():
    while not done:
        peak_anon[0] = max(peak_anon[0], status('RssAnon'))
        time.sleep(0.005)
sampler = threading.Thread(target=sample)
sampler.start()
convert_checkpoint(sys.argv[1], sys.argv[2], to=sys.argv[3])
done.append(1)
sampler.join()
print('MEMORY', peak_anon[0] - base_anon, status('VmHWM') - base_peak)
"""


def convert_memory(args: argparse.Namespace, where: Path) -> list[tuple[str, int, int]]:
    """(conversion, anonymous memory growth, peak RSS growth) in bytes, a process each."""
    from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO

    model = State(args.size_gb, args.tensors)
    io = DistributedCheckpointIO()
    io.write({"meta": {"iter": 1}, **io.states(model, None)}, where / "source.dcp", model=model)
    del model
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    steps = (("DCP -> torch", "source.dcp", "converted.pth", "torch"),
             ("DCP -> safetensors", "source.dcp", "converted.safetensors", "safetensors"),
             ("torch -> DCP", "converted.pth", "converted.dcp", "dcp"))
    rows = []
    for name, source, destination, target in steps:
        done = subprocess.run([sys.executable, "-c", _CONVERT, str(where / source),
                               str(where / destination), target],
                              capture_output=True, text=True, env=env, timeout=3600)
        line = [x for x in done.stdout.splitlines() if x.startswith("MEMORY ")]
        if done.returncode != 0 or not line:
            raise RuntimeError(f"{name} failed: {done.stderr.strip()[-500:]}")
        anon, peak = (int(x) for x in line[0].split()[1:])
        rows.append((name, anon, peak))
    for name in ("source.dcp", "converted.pth", "converted.safetensors", "converted.dcp"):
        _drop(where / name)
    return rows


def rank_worker(args: argparse.Namespace) -> None:
    """One of the two ranks of (b); rank 0 prints ``TIMES <sharded> <gathered> <ratio>``."""
    import torch.distributed as dist
    from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from flexgraph.cli.stopping import end_launched_rank
    from flexgraph.training.runtime import leave_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = State(args.size_gb, args.tensors)
    fully_shard(model)
    io = DistributedCheckpointIO()
    where = Path(args.dir)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def sharded() -> None:
        io.write({"meta": {"iter": 1}, **io.states(model, None)}, where / "sharded.dcp",
                 model=model)

    def gathered() -> None:
        state = get_model_state_dict(model, options=full)  # every rank joins the gather
        if rank == 0:
            fsynced_save({"state_dict": state, "meta": {"iter": 1}}, where / "gathered.pth")

    def timed_on_both(work: Callable[[], None]) -> Callable[[], float]:
        def once() -> float:
            if rank == 0:
                os.sync()
            dist.barrier()
            start = time.perf_counter()
            work()
            dist.barrier()
            elapsed = time.perf_counter() - start
            if rank == 0:
                _drop(where / "sharded.dcp")
                _drop(where / "gathered.pth")
            dist.barrier()
            return elapsed
        return once

    # Both ranks run the same rounds in the same order (interleave's is fixed).
    rounds = interleave({"sharded": timed_on_both(sharded),
                         "gathered": timed_on_both(gathered)}, args.repeats)
    if rank == 0:
        print(f"TIMES {rounds.of('sharded').median} {rounds.of('gathered').median} "
              f"{rounds.ratio('gathered', 'sharded').median}", flush=True)
    # As a launched rank of flexgraph run ends: leave together, skip the
    # interpreter's teardown (where gloo's threads can abort a finished rank).
    leave_process_group()
    end_launched_rank(0)


def report(args: argparse.Namespace, one: Rounds | None,
           two: tuple[float, float, float] | str | None, nbytes: int,
           memory: list[tuple[str, int, int]] | None = None,
           background: dict[str, Any] | None = None) -> list[str]:
    """The table: seconds, GB/s and speed ratios against the fsync'ed torch baseline
    (medians over rounds; each ratio taken within its round)."""
    gb = nbytes / 1e9
    lines = [f"checkpoint IO, {gb:.2f} GB in {args.tensors} float32 tensors, "
             f"median of {args.repeats}"]
    if one is not None:
        lines.append("(a) one process           save s   load s  save GB/s  load GB/s  "
                     "save x  load x  save x(no fsync)")
        for name in one.values:
            save, load = one.of(name, "save").median, one.of(name, "load").median
            speed = [one.ratio(base, name, key).median
                     for base, key in ((BASELINE, "save"), (BASELINE, "load"), (BARE, "save"))]
            lines.append(f"  {name:<36} {save:7.2f}  {load:7.2f}  {gb / save:9.2f}  "
                         f"{gb / load:9.2f}  {speed[0]:6.2f}  {speed[1]:6.2f}  {speed[2]:6.2f}")
    if two is not None:
        lines.append("(b) two ranks, FSDP2-sharded state      save s")
        if isinstance(two, str):
            lines.append(f"  {two}")
        else:
            sharded, gathered, ratio = two
            lines.append(f"  DCP sharded save (every rank)        {sharded:7.2f}")
            lines.append(f"  gather to rank 0 + torch.save        {gathered:7.2f}")
            lines.append(f"  sharded save speed x gathered: {ratio:.2f}")
    if background is not None:
        rounds = background["rounds"]
        blocked = {way: rounds.of(way, "blocked").median for way in ("async", "sync", "torch")}
        lines.append("(c) one process, training blocked by a save      blocked s")
        for label, value in (("portable, async_save=True, first save", background["first"]),
                             ("portable, async_save=True (buffers reused)", blocked["async"]),
                             ("portable, synchronous (DCP fsyncs)", blocked["sync"]),
                             ("torch.save + fsync", blocked["torch"])):
            lines.append(f"  {label:<44} {value:7.2f}")
        lines.append(f"  async blocked x synchronous: "
                     f"{rounds.ratio('async', 'sync', 'blocked').median:.2f}"
                     f"  x torch.save + fsync: "
                     f"{rounds.ratio('async', 'torch', 'blocked').median:.2f}")
        during, steady = background["during"], rounds.of("steady").median
        slowed = statistics.median(during) if during else 0.0
        lines.append(f"  iterations during the background write: "
                     f"{len(during) / args.repeats:.1f} per save, "
                     f"median {slowed:.3f} s vs steady {steady:.3f} s "
                     f"({slowed / steady if steady else 0.0:.2f}x)")
    if memory is not None:
        largest = nbytes / args.tensors
        lines.append(f"(d) ckpt convert, fresh process    anon MiB  peak RSS MiB  "
                     f"anon / largest tensor ({largest / 2**20:.1f} MiB)  anon / checkpoint")
        for name, anon, peak in memory:
            lines.append(f"  {name:<32} {anon / 2**20:8.1f}  {peak / 2**20:12.1f}  "
                         f"{anon / largest:38.2f}  {anon / nbytes:17.3f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # (a): no group
    args = parse_args(argv)
    if args.rank_worker:
        rank_worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="ckptbench-", dir=args.dir) as where:
        one = one_process(args, Path(where)) if args.part in ("all", "one") else None
        two = two_ranks(args, Path(where)) if args.part in ("all", "two") else None
        background = async_save(args, Path(where)) if args.part in ("all", "async") \
            else None
        memory = convert_memory(args, Path(where)) if args.part in ("all", "convert") \
            else None
    nbytes = args.tensors * rows_per_tensor(args.size_gb, args.tensors) * 1024 * 4
    print("\n".join(report(args, one, two, nbytes, memory, background)))


if __name__ == "__main__":
    main()
