"""The setup-memory benchmark's workload: the model, the data, what each rank records.

``setup_memory.py`` runs every row on this module: the flexgraph rows load it
through their config's ``custom_imports`` (so it is imported in each rank
while the config is read, before any step runs), the hand-written scripts
``_setup_hand_*.py`` import it directly. It registers:

* ``SetupBenchModel`` (``MODELS``): the memory benchmark's residual MLP
  (``_memory_workload.ResidualMLP``: pre-LayerNorm blocks ``width -> 4 width ->
  width``, a linear head) as an MMEngine ``BaseModel`` whose weights come from
  MMEngine's ``init_cfg``: ``TruncNormal`` on every ``Linear``, ``Constant`` on
  every ``LayerNorm`` (:data:`INIT_CFG`), which ``init_weights()`` applies;
* ``SetupRows`` (``DATASETS``): seeded random rows, the same in every process;
* ``SetupRecorder`` (``HOOKS``): each rank's record (:class:`SetupRecord`).

Under ``setup_memory.py --limit`` the rank enters its own memory cgroup as
this module is imported, its imports done (:mod:`_memory_limit`).

What a rank records (``setup-rank<R>.json`` in its work_dir):

* ``setup_peak_mib``: its peak resident memory from process start to the
  start of the first iteration;
* ``step_peaks_mib``: in a flexgraph rank, the peak of each setup step. A
  thread started when the model is built follows the rank's progress
  record (the step it is in, which ``flexgraph run`` keeps for its launcher)
  and, when the step changes, reads the kernel's high-water mark
  (``VmHWM``) as the finished step's peak and resets it
  (``/proc/self/clear_refs``), so each step's peak is its own;
* ``setup_end``: the wall clock (``time.time()``) when setup ended and the
  first iteration was about to start, to set against the launch's start;
* ``first_iter_end``: the wall clock when the first iteration's forward ended;
* ``first_loss``: the first iteration's loss on this rank (fp32): the
  forward of its first batch (see :class:`SetupRecorder`).
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _memory_limit import enter_from_env
from _memory_workload import ResidualBlock, ResidualMLP, SyntheticRows
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS

enter_from_env()  # under --limit: this rank's own memory cgroup, from here on

CLASSES = 10
BATCH = 4  # rows per rank in the one iteration that is run
SEED = 0
LR = 1e-4
RECORD_NAME = "setup-rank{rank}.json"
INIT_CFG = [dict(type="TruncNormal", layer="Linear", std=0.02, bias=0.0),
            dict(type="Constant", layer="LayerNorm", val=1.0, bias=0.0)]
"""MMEngine's ``init_cfg`` of the model: what ``init_weights()`` applies, layer by type."""


def width_for(parameters: float, blocks: int, classes: int = CLASSES) -> int:
    """The block width (a multiple of 8) giving about ``parameters`` in ``blocks`` blocks."""
    per_width_squared = 8 * blocks  # each block: w x 4w + 4w x w weights, the rest is O(w)
    width = int((parameters / per_width_squared) ** 0.5)
    return max(8, width - width % 8)


@MODELS.register_module(force=True)
class SetupBenchModel(BaseModel):
    """The residual MLP as an MMEngine model initialised by ``init_cfg``.

    ``init_weights()`` is MMEngine's own (``BaseModule``): it applies
    :data:`INIT_CFG` to the layers of each type, as OpenMMLab models are
    initialised. ``mode='loss'`` gives the cross-entropy.
    """

    def __init__(self, blocks: int, width: int, classes: int = CLASSES,
                 init_cfg: Any = None, data_preprocessor: dict | None = None) -> None:
        step_peaks()  # from build_model on, in this rank's own process
        super().__init__(data_preprocessor=data_preprocessor,
                         init_cfg=INIT_CFG if init_cfg is None else init_cfg)
        self.net = ResidualMLP(blocks, width, classes)

    def forward(self, inputs: Any, labels: Any = None, mode: str = "tensor") -> Any:
        logits = self.net(_stack(inputs))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, _stack(labels))}
        return logits


def _stack(x: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """MMEngine's ``pseudo_collate`` hands lists of samples; stack them into a batch."""
    return torch.stack(list(x)) if isinstance(x, (list, tuple)) else x


@DATASETS.register_module(force=True)
class SetupRows(SyntheticRows):
    """``n`` seeded random rows of ``width`` features and a label each (every process alike)."""


# -- what a rank measures ------------------------------------------------------------------

def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+)", text, re.M).group(1))


def _reset_high_water_mark() -> None:
    Path("/proc/self/clear_refs").write_text("5")


class StepPeaks:
    """Each setup step's peak resident memory in this rank (see the module docstring).

    Reads the step a flexgraph rank is in from its progress record; without
    one (a hand-written script, a run without a launcher) it records nothing
    and :meth:`overall_mib` is the process's peak.
    """

    def __init__(self) -> None:
        from flexgraph.training.output import LaunchEnv

        folder = LaunchEnv.read(os.environ).progress_dir
        rank = os.environ.get("RANK", "0")
        self.pid = os.getpid()
        self.record = Path(folder) / f"rank{rank}" if folder else None
        self.peaks: dict[str, float] = {}
        self.step: str | None = "before build_model"
        self.lock = threading.Lock()
        if self.record is not None and Path("/proc/self/clear_refs").exists():
            threading.Thread(target=self._follow, daemon=True, name="step-peaks").start()

    def _current(self) -> str | None:
        try:
            return json.loads(self.record.read_text().strip() or "{}").get("step")
        except (OSError, ValueError):
            return None

    def _follow(self) -> None:
        while True:
            step = self._current()
            with self.lock:
                if step != self.step:
                    self.close_step()
                    self.step = step
            time.sleep(0.002)

    def close_step(self) -> None:
        """The current step's peak so far, kept; the high-water mark starts again."""
        if self.step is not None:
            peak = _status_kib("VmHWM") / 1024
            self.peaks[self.step] = max(self.peaks.get(self.step, 0.0), peak)
        _reset_high_water_mark()

    def overall_mib(self) -> float:
        """The peak since the process started (the steps' and the current one's)."""
        with self.lock:
            now = _status_kib("VmHWM") / 1024
            if self.record is None:
                return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            return max([now, *self.peaks.values()])


_STEP_PEAKS: list[StepPeaks] = []


def step_peaks() -> StepPeaks | None:
    """This process's :class:`StepPeaks`, started on first use (Linux only).

    Started when the model is built, not when this module is imported: a
    flexgraph launcher imports it too (it reads the config), and ranks forked
    from it would inherit an object whose thread did not survive the fork.
    """
    if not sys.platform.startswith("linux"):
        return None
    if not _STEP_PEAKS or _STEP_PEAKS[0].pid != os.getpid():
        _STEP_PEAKS[:] = [StepPeaks()]
    return _STEP_PEAKS[0]


class SetupRecord:
    """One rank's figures, written as ``work_dir/setup-rank<R>.json``."""

    def __init__(self, work_dir: str | os.PathLike[str], rank: int) -> None:
        self.path = Path(work_dir) / RECORD_NAME.format(rank=rank)
        self.rank = rank
        self.setup_peak_mib: float | None = None
        self.step_peaks_mib: dict[str, float] = {}
        self.setup_end: float | None = None

    def setup_done(self) -> None:
        self.setup_end = time.time()
        tracker = step_peaks()
        if tracker is not None and tracker.record is not None:
            with tracker.lock:
                tracker.close_step()
                self.step_peaks_mib = dict(tracker.peaks)
            self.setup_peak_mib = max([*self.step_peaks_mib.values(), tracker.overall_mib()])
        else:
            self.setup_peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def first_iteration_done(self, loss: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({
            "rank": self.rank, "setup_peak_mib": self.setup_peak_mib,
            "step_peaks_mib": self.step_peaks_mib, "setup_end": self.setup_end,
            "first_iter_end": time.time(),
            "first_loss": loss}))


@HOOKS.register_module(force=True)
class SetupRecorder(Hook):
    """Records this rank's setup (:class:`SetupRecord`) when training is about to start,
    computes the loss of its first batch, and ends the rank there.

    The first iteration's loss is the forward of the loop's first batch (taken
    from ``runner.train_dataloader`` as the loop takes it, prepared by the
    model's data preprocessor, in train mode), without its backward and
    optimizer step: four whole-model DDP ranks of the largest size would
    need about 8 GiB each for those (gradients, buckets, AdamW's moments),
    and what is measured here is setup. Every rank then leaves together
    (exit status 0).
    """

    priority = "LOWEST"

    def before_train(self, runner) -> None:
        record = SetupRecord(runner.work_dir, runner.rank)
        record.setup_done()
        model = runner.model  # DDP's wrapper, FSDP's sharded model, DeepSpeed's engine
        inner = getattr(model, "module", model)
        forward = getattr(model, "engine", model)
        data = inner.data_preprocessor(next(iter(runner.train_dataloader)), True)
        with torch.no_grad():
            record.first_iteration_done(float(forward(**data, mode="loss")["loss"]))
        import torch.distributed as dist

        if dist.is_initialized():
            leave(dist.barrier, dist.destroy_process_group)
        sys.stdout.flush()
        os._exit(0)


# -- what the hand-written scripts share ----------------------------------------------------

def seed_like_flexgraph(seed: int = SEED) -> None:
    """Seed python, numpy and torch as a flexgraph run seeds them (``randomness.seed``)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def first_batch(width: int, rank: int, world_size: int) -> dict[str, Any]:
    """This rank's first batch as a flexgraph run takes it: MMEngine's DefaultSampler
    without shuffling (rank ``r`` gets rows ``r, r + W, ...``), pseudo-collated."""
    rows = SetupRows(BATCH * world_size, width, CLASSES, SEED)
    items = [rows[i] for i in range(rank, BATCH * world_size, world_size)][:BATCH]
    return {"inputs": [x["inputs"] for x in items], "labels": [x["labels"] for x in items]}


def block_units(model: SetupBenchModel) -> list[torch.nn.Module]:
    """The blocks: the units a wrap policy of one block each picks."""
    return [m for m in model.modules() if isinstance(m, ResidualBlock)]


def hand_arguments(description: str, ways: tuple[str, ...] = ()) -> Any:
    """A hand-written script's arguments (``ways``: the choices of its ``--way``, if any)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--blocks", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--work-dir", required=True)
    if ways:
        parser.add_argument("--way", choices=ways, required=True)
    return parser.parse_args()


def hand_first_loss(model: Any, width: int, rank: int, world_size: int,
                    record: SetupRecord) -> None:
    """The setup's record, then the first batch's loss (forward only, as the flexgraph
    rows' :class:`SetupRecorder` computes it)."""
    record.setup_done()
    batch = first_batch(width, rank, world_size)
    with torch.no_grad():
        loss = model(inputs=_stack(batch["inputs"]), labels=_stack(batch["labels"]),
                     mode="loss")["loss"]
    record.first_iteration_done(float(loss))


def leave(barrier: Any, destroy: Any) -> None:
    """Leave together and skip the interpreter's teardown (gloo's threads can abort it)."""
    barrier()
    destroy()
    sys.stdout.flush()
    os._exit(0)


def each_rank_makes_its_rows(env: Any, model: Any, record: Any, source_rank: int) -> None:
    """The other way to place ``init_weights`` under FSDP, for the ``fsdp-own`` row: every
    rank makes each parameter whole from the record, one at a time, and keeps its rows.

    No scatter, and the same peak (one parameter in flight), but every rank draws
    every value: W times the generator's work of ``scatter_rows``, where the ranks
    make the parameters in turn. The row measures which costs more.
    """
    from flexgraph.strategies.fsdp.shards import local_rows, local_tensor

    for name, param in model.named_parameters():
        if record.reads_held([name]):
            raise RuntimeError(f"{name!r} reads a tensor only rank {source_rank} holds")
        start, stop = local_rows(param)
        local = local_tensor(param)
        value = record.values([name])[name]
        with torch.no_grad():
            local.copy_(value.reshape(-1, *value.shape[1:])[start:stop].view_as(local))


def _register_fsdp_own() -> None:
    from flexgraph import Configure, get_strategy, register_strategy

    place = f"{__name__}:each_rank_makes_its_rows"
    register_strategy("fsdp_own_rows", lambda **options: get_strategy("fsdp", **options).then(
        Configure("init_weights", {"place": place})))


_register_fsdp_own()
