"""How much does flexgraph's training loop cost per iteration over a hand-written one?

The workload (``_tiny.py``) is deliberately tiny (an MLP step on one CPU
thread), so that any per-iteration overhead shows. It runs in several config
shapes (``_loop_shapes.py``), since a cost one shape spreads thin another
pays in full: ``tiny`` (200 iterations an epoch, batch 32, width 128, SGD),
``short-epochs`` (32 iterations an epoch, AdamW, a ``LinearLR`` stepped every
iteration: per-epoch work six times as often) and ``wide`` (width 1024,
AdamW, the same scheduler).

The comparisons, flexgraph against the hand-written loop a user would write
for the same model, optimizer and scheduler:

* ``plain``: an ``nn.Module`` whose forward returns the loss; the hand loop
  is ``zero_grad / forward / backward / step`` and ``loss.item()``.
* ``api``: MMEngine's path: a ``BaseModel`` (``train_step``), dict samples
  collated by ``pseudo_collate``, an ``OptimWrapper`` and MMEngine's default
  hooks; the hand loop calls the same ``train_step`` on the same loader.
* ``terminal``: ``plain`` with both sides under a pseudo-terminal, where
  flexgraph draws its progress bar (the CPU time of every thread counts).
* ``calibrate`` / ``calibrate-api``: the hand loop against itself, the
  method's own noise in that shape.
* ``watchdog`` (only with ``--only``): ``flexgraph-plain`` with its progress
  watchdog (on by default) against the same run with it off
  (``env_cfg.stall_timeout=0``), in the ``hand`` column.
* ``plain-wrapped`` (only with ``--only``): ``flexgraph-plain`` against the
  plain hand loop stepping through MMEngine's ``OptimWrapper.update_params``,
  as flexgraph's loop steps every model: flexgraph's own per-iteration work.

A scheduled shape's hand loops step MMEngine's ``LinearLR`` after every
iteration, as ``ParamSchedulerHook`` does in flexgraph's run. flexgraph runs as
``flexgraph run cfg.py`` (the CLI's entry point, in the measuring process),
with a log line every 50 iterations at the INFO level, metrics.jsonl and the
work_dir record on, checkpointing and TensorBoard off (``--tensorboard`` adds a
``TensorboardVisBackend``).

Method. Every measurement is a fresh process (``--child``) that warms up and
then runs the whole thing (build, train) for the shape's LO and HI epochs,
``--repeats`` times each (the fastest of each counts: interference only adds
time); ``(t_HI - t_LO) / ((HI - LO) * iters)`` is the cost of one more
iteration, with imports, setup and per-run costs cancelled and each epoch's
own work included. The two processes of a comparison run side by side,
pinned to the same CPU, in lockstep (:class:`_Lockstep`), so that each side's
training runs beside the other's training; as many pairs run at once as
there are CPUs (``--jobs``). The rounds are ``_harness.py``'s: the pair's
order reverses every other round, each round's flexgraph/hand ratio is taken
on its pair, and the figure is the median over rounds, with the spread, in
process CPU time (the figure to read on a shared machine) and wall time.
Every child runs with glibc's heap thresholds fixed (:data:`FIXED_HEAP`), so
that the heap's adaptive thresholds do not make two runs of one loop
differ::

    python benchmarks/loop_overhead.py [--rounds R] [--shapes tiny,short-epochs,wide]
                                       [--only plain,api,terminal,calibrate,calibrate-api,
                                               watchdog,plain-wrapped]
                                       [--iters N] [--epochs LO,HI] [--repeats K] [--jobs J]
                                       [--with-mmengine] [--tensorboard]

``--iters`` and ``--epochs`` replace every chosen shape's own; ``--only``
replaces each shape's comparisons; ``--with-mmengine`` adds MMEngine's
``FlexibleRunner`` on each shape's model-API config.

The guardrail, on every shape: flexgraph's CPU time per iteration, median
over the rounds, at most :data:`GUARDRAIL` times the hand loop's. The
summary says whether it holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _tiny  # noqa: E402 (this folder is on sys.path when run as a script)
from _harness import Clocks, Rounds, Spread, round_order, timed  # noqa: E402
from _loop_shapes import (  # noqa: E402
    SHAPES,
    Shape,
    build_optimizer,
    build_schedulers,
    mlp,
    optimizer_cfg,
    scheduler_cfg,
    shape_named,
)
from _tiny import TinyData  # noqa: E402

ROUNDS = 5
_TENSORBOARD_ENV = "LOOP_OVERHEAD_TENSORBOARD"  # --tensorboard, as the children see it
TIMEOUT_S = 600  # per child: a hung child fails the benchmark instead of hanging it
# flexgraph / hand, CPU time per iteration, median over rounds, on every shape
GUARDRAIL = 1.10
# The comparisons: name -> (hand variant, flexgraph variant, under a pseudo-terminal)
COMPARISONS = {
    "plain": ("hand-plain", "flexgraph-plain", False),
    "api": ("hand-api", "flexgraph-api", False),
    "terminal": ("hand-plain", "flexgraph-plain", True),
    # the hand loops against themselves: the method's own noise in that shape
    "calibrate": ("hand-plain", "hand-plain-again", False),
    "calibrate-api": ("hand-api", "hand-api-again", False),
    # Opt-in (``--only``): flexgraph with its progress watchdog (on by default) against
    # the same run with it off (``env_cfg.stall_timeout=0``).
    "watchdog": ("flexgraph-plain-unwatched", "flexgraph-plain", False),
    # Opt-in: the plain hand loop stepping through ``OptimWrapper.update_params``, as
    # flexgraph's one loop path does: flexgraph's own per-iteration work alone.
    "plain-wrapped": ("hand-plain-wrapped", "flexgraph-plain", False),
}
# glibc's heap, the same in every child: blocks up to 32 MiB come from the heap, which
# keeps up to 256 MiB free at its top instead of giving it back.
FIXED_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
# Which calibration measures the hand loop of a comparison against itself.
CALIBRATION_OF = {"hand-plain": "calibrate", "hand-api": "calibrate-api"}


# -- the workload of a shape (both forms of the model) -------------------------------------

def _register() -> None:
    """Register the workload's components in MMEngine's registries (children only)."""
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel
    from mmengine.registry import DATASETS, HOOKS, MODELS

    class LoopMLP(torch.nn.Module):
        """The plain model: ``forward(x, y)`` returns the loss (``_tiny.TinyMLP`` at width 128)."""

        def __init__(self, width: int = 128) -> None:
            super().__init__()
            self.net = mlp(width)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(self.net(x), y)

    class LoopBaseModel(BaseModel):
        """The same MLP behind MMEngine's BaseModel contract: ``forward(inputs,
        data_samples, mode)``; lists of samples (``pseudo_collate``) are stacked."""

        def __init__(self, width: int = 128, data_preprocessor: Any = None) -> None:
            super().__init__(data_preprocessor=data_preprocessor)
            self.net = mlp(width)

        def forward(self, inputs, data_samples, mode="tensor"):
            inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
            logits = self.net(inputs)
            if mode == "loss":
                labels = (torch.stack(data_samples) if isinstance(data_samples, list)
                          else data_samples)
                return {"loss": F.cross_entropy(logits, labels)}
            return logits

    class TinyDictData(TinyData):
        """The same samples as dicts, as MMEngine datasets yield them."""

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"inputs": self.x[i], "data_samples": self.y[i]}

    class LockstepHook(Hook):
        """flexgraph's side of the training barrier (:meth:`_Lockstep.at_training`):
        ``before_train`` only, which changes nothing the loop does per iteration."""

        def before_train(self, runner: Any) -> None:
            _LOCKSTEP.at_training()

    HOOKS.register_module(module=LockstepHook, force=True)
    MODELS.register_module(module=LoopMLP, force=True)
    MODELS.register_module(module=LoopBaseModel, force=True)
    DATASETS.register_module(module=TinyData, force=True)
    DATASETS.register_module(module=TinyDictData, force=True)


def _config(work_dir: str, shape: Shape, epochs: int, api: bool) -> dict[str, Any]:
    """The MMEngine-style config of ``shape``, trained for ``epochs`` epochs."""
    cfg = _tiny.config(work_dir, shape.iters)
    cfg["model"] = dict(type="LoopBaseModel" if api else "LoopMLP", width=shape.width)
    cfg["train_dataloader"]["batch_size"] = shape.batch
    cfg["train_dataloader"]["dataset"]["n"] = shape.iters * shape.batch
    cfg["optim_wrapper"]["optimizer"] = optimizer_cfg(shape)
    if shape.scheduler:
        cfg["param_scheduler"] = scheduler_cfg(shape, epochs)
    cfg["train_cfg"]["max_epochs"] = epochs
    cfg["custom_hooks"] = [dict(type="LockstepHook")]
    if os.environ.get(_TENSORBOARD_ENV) == "1":
        cfg["visualizer"] = dict(type="Visualizer",
                                 vis_backends=[dict(type="TensorboardVisBackend")])
    if api:
        cfg["train_dataloader"]["dataset"]["type"] = "TinyDictData"
        cfg["optim_wrapper"]["type"] = "OptimWrapper"
        cfg["default_hooks"] = dict(  # MMEngine's defaults, spelled out as configs do
            runtime_info=dict(type="RuntimeInfoHook"), timer=dict(type="IterTimerHook"),
            sampler_seed=dict(type="DistSamplerSeedHook"),
            logger=dict(type="LoggerHook", interval=50),
            param_scheduler=dict(type="ParamSchedulerHook"), checkpoint=None)
    return cfg


# -- one whole run of each variant (build, then train) -------------------------------------

def hand_plain(shape: Shape, epochs: int, work_dir: str, wrapped: bool = False) -> None:
    """``wrapped``: the step through MMEngine's ``OptimWrapper.update_params``, as
    flexgraph's loop steps every model, instead of the optimizer's own calls."""
    from mmengine.optim import OptimWrapper
    from mmengine.registry import MODELS

    torch.manual_seed(0)
    model = MODELS.build(dict(type="LoopMLP", width=shape.width))
    optimizer = build_optimizer(shape, model.parameters())
    optim_wrapper = OptimWrapper(optimizer) if wrapped else None
    schedulers = build_schedulers(shape, optim_wrapper or optimizer, epochs)
    loader = torch.utils.data.DataLoader(TinyData(shape.iters * shape.batch),
                                         batch_size=shape.batch, shuffle=True)
    logged = []
    _LOCKSTEP.at_training()
    for _ in range(epochs):
        for x, y in loader:
            if optim_wrapper is not None:
                loss = model(x, y)
                optim_wrapper.update_params(loss)
            else:
                optimizer.zero_grad()
                loss = model(x, y)
                loss.backward()
                optimizer.step()
            logged.append(loss.item())
            for scheduler in schedulers:
                scheduler.step()


def hand_api(shape: Shape, epochs: int, work_dir: str) -> None:
    from mmengine.dataset import DefaultSampler, pseudo_collate
    from mmengine.optim import OptimWrapper
    from mmengine.registry import DATASETS, MODELS

    torch.manual_seed(0)
    model = MODELS.build(dict(type="LoopBaseModel", width=shape.width))
    optim_wrapper = OptimWrapper(build_optimizer(shape, model.parameters()))
    schedulers = build_schedulers(shape, optim_wrapper, epochs)
    dataset = DATASETS.build(dict(type="TinyDictData", n=shape.iters * shape.batch))
    sampler = DefaultSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=shape.batch, sampler=sampler,
                                         collate_fn=pseudo_collate)
    model.train()
    logged = []
    _LOCKSTEP.at_training()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            log_vars = model.train_step(batch, optim_wrapper)
            logged.append(log_vars["loss"].item())
            for scheduler in schedulers:
                scheduler.step()


def flexgraph_run(shape: Shape, epochs: int, work_dir: str, api: bool,
                  watched: bool = True) -> None:
    """``flexgraph run cfg.py``: the CLI's own entry point, in this process.

    Everything a user's run does (load the config file, plan, print the plan
    and the setup timings, record the run in the work_dir, train with the
    console output on) except starting the interpreter, which the slope
    cancels anyway. The config file is written once per epoch count
    (:func:`_config_file`), not in every timed run: formatting it (MMEngine's
    ``Config.dump`` runs yapf) is the benchmark's work, not the run's.
    """
    from flexgraph.cli.main import main as flexgraph_main

    path = _config_file(shape, epochs, api)
    unwatched = [] if watched else ["--cfg-options", "env_cfg.stall_timeout=0"]
    if flexgraph_main(["run", str(path), "--work-dir", work_dir, *unwatched]) != 0:
        raise RuntimeError(f"flexgraph run {path} failed")


_CONFIG_FILES: dict[tuple[str, int, bool], Path] = {}
_CONFIG_DIR: list[tempfile.TemporaryDirectory] = []  # removed when the process exits


def _config_file(shape: Shape, epochs: int, api: bool) -> Path:
    """The config file of ``shape`` for ``epochs`` epochs, written on first use."""
    key = (shape.name, epochs, api)
    if key not in _CONFIG_FILES:
        from mmengine.config import Config

        if not _CONFIG_DIR:
            _CONFIG_DIR.append(tempfile.TemporaryDirectory(prefix="loop_overhead_cfg_"))
        folder = Path(_CONFIG_DIR[0].name)
        cfg = _config(str(folder / "work_dir"), shape, epochs, api)
        cfg["log_level"] = "INFO"  # the default a user runs with: log lines are printed
        # The hand loops train on the CPU, so flexgraph must too where CUDA exists.
        cfg["strategy"] = dict(type="single", device="cpu")
        path = folder / f"{shape.name}_{epochs}_{'api' if api else 'plain'}.py"
        Config(cfg).dump(str(path))
        _CONFIG_FILES[key] = path
    return _CONFIG_FILES[key]


def mmengine_run(shape: Shape, epochs: int, work_dir: str) -> None:
    """MMEngine's FlexibleRunner (the runner flexgraph succeeds) on the model-API config."""
    from mmengine.runner import FlexibleRunner

    cfg = _config(work_dir, shape, epochs, api=True)
    cfg["default_hooks"]["checkpoint"] = dict(type="CheckpointHook", interval=-1,
                                              save_last=False)
    FlexibleRunner(**cfg, strategy=dict(type="SingleDeviceStrategy"),
                   experiment_name=f"bench_{epochs}_{time.monotonic_ns()}").train()


VARIANTS = {
    "hand-plain": hand_plain,
    "hand-plain-again": hand_plain,
    "hand-plain-wrapped": lambda s, e, d: hand_plain(s, e, d, wrapped=True),
    "hand-api": hand_api,
    "hand-api-again": hand_api,
    "flexgraph-plain": lambda s, e, d: flexgraph_run(s, e, d, api=False),
    "flexgraph-api": lambda s, e, d: flexgraph_run(s, e, d, api=True),
    "flexgraph-plain-unwatched": lambda s, e, d: flexgraph_run(s, e, d, api=False,
                                                               watched=False),
    "mmengine-api": mmengine_run,
}


def _warmed_up(variant: str, shape: Shape, tmp: str) -> Any:
    """Ready a child to measure ``variant`` on ``shape``: one thread, its config files
    written, one warm-up run done in ``tmp``; returns the variant's run function."""
    torch.set_num_threads(1)  # every side alike: no OpenMP oversubscription on few cores
    _register()
    run = VARIANTS[variant]
    if variant.startswith("flexgraph"):
        for n in (1, *shape.epochs):  # written before anything is measured
            _config_file(shape, n, api=variant.endswith("api"))
    run(shape, 1, f"{tmp}/warm")
    return run


def measure(variant: str, shape: Shape, repeats: int, result: str, wait: bool,
            partner: str | None = None) -> None:
    """One measurement: warm up, then time LO and HI epochs of ``shape``; write the slope.

    Each epoch count runs ``repeats`` times (alternating LO and HI) and keeps its
    fastest time: interference from other processes only ever adds time. With
    ``wait``, the timing starts when the parent says so (``{result}.go``
    exists), after both processes of a pair are warm (``{result}.ready``).
    With a ``partner`` (the other process's result file), the two go in
    lockstep (:class:`_Lockstep`).
    """
    global _LOCKSTEP
    times: dict[int, list[Clocks]] = {n: [] for n in shape.epochs}
    with tempfile.TemporaryDirectory() as tmp:
        run = _warmed_up(variant, shape, tmp)
        if wait:
            Path(f"{result}.ready").touch()
            while not Path(f"{result}.go").exists():
                time.sleep(0.005)
        _LOCKSTEP = lockstep = _Lockstep(
            result, partner, lambda: run(shape, 1, f"{tmp}/fill_{time.monotonic_ns()}"))
        for i in range(repeats):
            for n in shape.epochs:
                lockstep.start()
                times[n].append(timed(lambda n=n, i=i: run(shape, n, f"{tmp}/run_{i}_{n}")))
                lockstep.finish()
    lo, hi = shape.epochs
    extra = (hi - lo) * shape.iters
    slope = {clock: (min(getattr(t, clock) for t in times[hi])
                     - min(getattr(t, clock) for t in times[lo])) / extra * 1e3
             for clock in ("wall", "cpu")}
    Path(result).write_text(json.dumps({"variant": variant, "ms_per_iter": slope,
                                        "tty": sys.stdout.isatty()}))


class _Lockstep:
    """Keep the timed runs of a pair's two processes side by side, phase for phase.

    The two sides of a comparison differ in setup (flexgraph plans, prints
    and records before it trains; the hand loop builds three objects), so
    timed side by side they drift out of phase, and how much one side's
    training costs depends on what the other is doing beside it. In lockstep:

    * each timed run starts with its partner's (:meth:`start`);
    * each side waits for the other just before its first iteration
      (:meth:`at_training`: the hand loops call it, flexgraph's run reaches
      it through a ``before_train`` hook), so setups run beside a sleeping
      partner and training runs beside training;
    * the side done first trains on, untimed, until the other is done with
      that run (:meth:`finish`), so that no timed iteration runs alone.

    The barriers are marker files next to the result files. Outside a timed
    run (warm-up, filler) :meth:`at_training` returns at once.
    """

    def __init__(self, result: str | None = None, partner: str | None = None,
                 fill: Any = None) -> None:
        self.result, self.partner, self.fill = result, partner, fill
        self.count = 0
        self.armed = False  # inside a timed run, before its training barrier

    def _meet(self, name: str) -> None:
        Path(f"{self.result}.{name}{self.count}").touch()
        while not Path(f"{self.partner}.{name}{self.count}").exists():
            time.sleep(0.0005)

    def start(self) -> None:
        """Wait (untimed) until the partner is about to start the same run."""
        if self.partner is not None:
            self._meet("start")
            self.armed = True

    def at_training(self) -> None:
        """Wait until the partner is about to train too (in a timed run only)."""
        if self.armed:
            self.armed = False
            self._meet("train")

    def finish(self) -> None:
        """Train on, untimed, until the partner has finished the same run."""
        if self.partner is None:
            return
        Path(f"{self.result}.done{self.count}").touch()
        while not Path(f"{self.partner}.done{self.count}").exists():
            self.fill()
        self.count += 1


_LOCKSTEP = _Lockstep()  # this process's (``measure`` replaces it in a paired child)


# -- the parent: processes side by side ----------------------------------------------------

def _child_command(variant: str, shape: Shape) -> list[str]:
    """A child process that measures ``variant`` on ``shape`` (its own iterations and epochs)."""
    lo, hi = shape.epochs
    return [sys.executable, __file__, "--child", variant, "--shapes", shape.name,
            "--iters", str(shape.iters), "--epochs", f"{lo},{hi}"]


def _child_env(args: argparse.Namespace) -> dict[str, str]:
    """Every child's environment: one thread, no warnings, the same heap and backends."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
            _TENSORBOARD_ENV: "1" if args.tensorboard else "0", **FIXED_HEAP}


class _Child:
    """One measuring process, started now, with its stdout a pipe or a pseudo-terminal."""

    def __init__(self, variant: str, shape: Shape, args: argparse.Namespace, tty: bool,
                 tmp: str, cpu: int, result: Path, partner: Path) -> None:
        self.variant, self.tty = variant, tty
        self.result = result
        # pinned, timed when both are ready, in lockstep with its partner (_Lockstep)
        self.command = [*_child_command(variant, shape), "--repeats", str(args.repeats),
                        "--result", str(result), "--cpu", str(cpu), "--wait",
                        "--partner", str(partner)]
        env = _child_env(args)
        self.master = self.reader = None
        if tty:
            # A 120x40 pseudo-terminal, drained by a thread so that the child never blocks.
            self.master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            self.process = subprocess.Popen(self.command, env={**env, "TERM": "xterm-256color"},
                                            cwd=tmp, stdin=slave, stdout=slave, stderr=slave)
            os.close(slave)
            self.reader = threading.Thread(target=self._drain, daemon=True)
            self.reader.start()
        else:
            self.process = subprocess.Popen(self.command, env=env, cwd=tmp,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)

    def _drain(self) -> None:
        while True:
            try:
                if not os.read(self.master, 65536):
                    return
            except OSError:  # EIO: the child closed the terminal
                return

    def ready(self) -> bool:
        if self.process.poll():
            raise subprocess.CalledProcessError(self.process.returncode, self.command)
        return Path(f"{self.result}.ready").exists()

    def go(self) -> None:
        Path(f"{self.result}.go").touch()

    def finish(self) -> dict[str, float]:
        """Wait for the child; its ms-per-iteration slopes (``cpu``, ``wall``)."""
        try:
            if self.process.wait(timeout=TIMEOUT_S):
                raise subprocess.CalledProcessError(self.process.returncode, self.command)
        finally:
            if self.reader is not None:
                self.reader.join(timeout=5)
                os.close(self.master)
        data = json.loads(self.result.read_text())
        if data["tty"] != self.tty:
            raise RuntimeError(f"{self.variant}: expected a terminal={self.tty} child")
        return data["ms_per_iter"]


class _Side:
    """One comparison on one shape, and what its rounds measured (``_harness.Rounds``:
    each round's ms-per-iteration slopes of both variants, ``cpu`` and ``wall``)."""

    def __init__(self, shape: Shape, name: str, hand: str, other: str, tty: bool) -> None:
        self.shape, self.name, self.hand, self.other, self.tty = shape, name, hand, other, tty
        self.rounds = Rounds([hand, other])

    def record(self, got: dict[str, dict[str, float]]) -> None:
        self.rounds.add(got)

    def median_ms(self, variant: str, clock: str = "cpu") -> float:
        return self.rounds.of(variant, clock).median

    def ratio(self, clock: str = "cpu") -> Spread:
        """flexgraph (or the other side) over the hand loop, round by round."""
        return self.rounds.ratio(self.other, self.hand, clock)

    @property
    def is_calibration(self) -> bool:
        return self.name.startswith("calibrate")

    @property
    def guarded(self) -> bool:
        """Whether the guardrail applies: flexgraph's side (not a calibration, not MMEngine's)."""
        return self.other.startswith("flexgraph")


def _chosen_shapes(args: argparse.Namespace) -> list[Shape]:
    """The ``--shapes``, with ``--iters`` / ``--epochs`` put in place of their own."""
    shapes = []
    for name in (n for n in args.shapes.split(",") if n):
        shape = shape_named(name)
        if args.iters is not None:
            shape = dataclasses.replace(shape, iters=args.iters)
        if args.epochs is not None:
            lo, hi = (int(n) for n in args.epochs.split(","))
            shape = dataclasses.replace(shape, epochs=(lo, hi))
        shapes.append(shape)
    return shapes


def _sides(shapes: list[Shape], args: argparse.Namespace) -> list[_Side]:
    """Every comparison to run: each shape's own (or ``--only``'s), plus MMEngine's if asked."""
    only = [c for c in args.only.split(",") if c] if args.only else None
    unknown = sorted(set(only or ()) - set(COMPARISONS))
    if unknown:
        raise SystemExit(f"no comparison {unknown}; the comparisons are {', '.join(COMPARISONS)}")
    sides = []
    for shape in shapes:
        for name in only or shape.comparisons:
            sides.append(_Side(shape, name, *COMPARISONS[name]))
        if args.with_mmengine:
            sides.append(_Side(shape, "mmengine", "hand-api", "mmengine-api", False))
    return sides


class _Pair:
    """The two processes of one comparison's round, pinned to ``cpu`` and timed together.

    Started at once; :meth:`poll` tells both to start timing when both are warm,
    and says when both are done.
    """

    def __init__(self, side: _Side, round_: int, args: argparse.Namespace, tmp: str,
                 cpu: int) -> None:
        self.side, self.round = side, round_
        variants = round_order([side.hand, side.other], round_)
        results = [Path(tempfile.mktemp(dir=tmp, suffix=".json")) for _ in variants]
        self.children = [_Child(v, side.shape, args, side.tty, tmp, cpu, result, partner)
                         for v, result, partner in zip(variants, results, results[::-1],
                                                       strict=True)]
        self.timing = False

    def poll(self) -> bool:
        """Start the timing once both are warm; whether both have finished."""
        if not self.timing:
            if all(proc.ready() for proc in self.children):
                for proc in self.children:  # both warm: time them side by side
                    proc.go()
                self.timing = True
            return False
        return all(proc.process.poll() is not None for proc in self.children)

    def finish(self) -> None:
        self.side.record({proc.variant: proc.finish() for proc in self.children})


def _cpus(args: argparse.Namespace) -> list[int]:
    """The CPUs that pairs run on, one pair at a time on each."""
    return sorted(os.sched_getaffinity(0))[:max(1, args.jobs)]


def _measure_rounds(sides: list[_Side], args: argparse.Namespace) -> None:
    """Every side's pair of every round, in order, as many at once as there are CPUs.

    A pair takes whichever CPU is free, so a comparison's rounds run on
    different CPUs; the two processes of a pair always share their conditions.
    """
    cpus = _cpus(args)
    pending = [(round_, side) for round_ in range(args.rounds) for side in sides]
    left = {round_: len(sides) for round_ in range(args.rounds)}
    running: dict[int, _Pair] = {}
    with tempfile.TemporaryDirectory() as tmp:
        while pending or running:
            for cpu in [c for c in cpus if c not in running][:len(pending)]:
                round_, side = pending.pop(0)
                running[cpu] = _Pair(side, round_, args, tmp, cpu)
            for cpu, pair in list(running.items()):
                if pair.poll():
                    pair.finish()
                    del running[cpu]
                    left[pair.round] -= 1
                    if not left[pair.round]:
                        print(f"round {pair.round + 1}/{args.rounds} done", file=sys.stderr,
                              flush=True)
            time.sleep(0.01)


def _report_shape(shape: Shape, sides: list[_Side]) -> None:
    """One shape: every variant's slope, and every comparison's ratio, over the rounds."""
    lo, hi = shape.epochs
    print(f"shape {shape.name}: {shape.describe()}; epochs {lo} and {hi} per process")
    print("  ms per iteration (slope between the two epoch counts):")
    for side in sides:
        where = " (terminal)" if side.tty else ""
        for variant in (side.hand, side.other):
            for clock in ("cpu", "wall"):
                print(f"    {variant + where:>28} {clock:>4}: "
                      f"{side.rounds.of(variant, clock)}  [{side.name}]")
    for side in sides:
        label = f"  ratio {side.other}/{side.hand}{' on a terminal' if side.tty else ''}: "
        print(f"{label}CPU {side.ratio('cpu')}")
        print(f"{'':>{len(label) - 2}}wall {side.ratio('wall')}")
    by_name = {side.name: side for side in sides}
    if "plain" in by_name and "terminal" in by_name:
        plain = by_name["plain"].median_ms("flexgraph-plain")
        term = by_name["terminal"].median_ms("flexgraph-plain")
        print(f"  flexgraph-plain on a terminal / without one: CPU {term / plain:.3f}")


def _itself(calibration: _Side | None) -> str:
    """The hand loop against itself in CPU time: median (min, max), or why it is missing."""
    if calibration is None:
        return "not run"
    return format(calibration.ratio("cpu"), ".3f").removeprefix("median ")


def _summary_row(side: _Side, calibration: _Side | None) -> tuple[str, float]:
    """One comparison's line of the summary, and its ratio (CPU time, median)."""
    ratio = side.ratio().median
    verdict = ("ok" if ratio <= GUARDRAIL else "over") if side.guarded else "-"
    name = side.name + (" (tty)" if side.tty else "")
    line = (f"  {side.shape.name:<13} {name:<16} {side.median_ms(side.other):>9.3f} "
            f"{side.median_ms(side.hand):>7.3f} {ratio:>7.3f} "
            f"[{side.ratio('wall').median:.3f}]  {_itself(calibration):<30} {verdict}")
    return line, ratio


def _summary(shapes: list[Shape], sides: list[_Side]) -> bool:
    """Per shape and comparison: medians (ms per iteration), the ratio, and the hand loop
    against itself in that shape; then the guardrail. Returns whether it holds."""
    print(f"summary: medians over the rounds; ms per iteration and ratios in CPU time "
          f"(wall in brackets); guardrail: ratio <= {GUARDRAIL}")
    print(f"  {'shape':<13} {'comparison':<16} {'flexgraph':>9} {'hand':>7} "
          f"{'ratio':>7} {'[wall]':>7}  {'hand vs itself':<30} guardrail")
    ratios: dict[str, float] = {}
    for shape in shapes:
        own = [side for side in sides if side.shape is shape]
        calibrations = {side.name: side for side in own if side.is_calibration}
        for side in own:
            if not side.is_calibration:
                line, ratio = _summary_row(side, calibrations.get(CALIBRATION_OF.get(side.hand,
                                                                                      "")))
                print(line)
                if side.guarded:
                    ratios[f"{shape.name} {side.name}"] = ratio
    held = all(r <= GUARDRAIL for r in ratios.values())
    worst = max(ratios, key=ratios.get, default=None)
    highest = f" (highest: {worst} {ratios[worst]:.3f})" if worst is not None else ""
    print(f"guardrail, CPU time median <= {GUARDRAIL} on every shape: "
          f"{'holds' if held else 'NOT MET'}{highest}")
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated config shapes to time: {', '.join(SHAPES)}")
    parser.add_argument("--iters", type=int,
                        help="iterations per epoch, in every shape (default: each shape's own)")
    parser.add_argument("--epochs",
                        help="LO,HI epochs of each timed pair, in every shape "
                             "(default: each shape's own)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each epoch count per process (the fastest counts)")
    parser.add_argument("--only",
                        help="comma-separated comparisons to run on every shape: plain, api, "
                             "terminal, calibrate, calibrate-api (the hand loops against "
                             "themselves), watchdog; default: each shape's own")
    parser.add_argument("--with-mmengine", action="store_true",
                        help="also time MMEngine's FlexibleRunner on each model-API config")
    parser.add_argument("--tensorboard", action="store_true",
                        help="flexgraph's runs write TensorBoard scalars too")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="pairs timed at once, each on its own CPU (default: one per "
                             "CPU; 1: one pair at a time)")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--wait", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--partner", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = _chosen_shapes(args)
    if args.child:
        if args.cpu is not None:
            os.sched_setaffinity(0, {args.cpu})
        measure(args.child, shapes[0], args.repeats, args.result, args.wait, args.partner)
        return
    sides = _sides(shapes, args)
    _measure_rounds(sides, args)
    print(f"{args.rounds} rounds, {len(_cpus(args))} pairs at once (each pair on one CPU), "
          f"torch {torch.__version__}, 1 thread, "
          f"TensorBoard {'on' if args.tensorboard else 'off'}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for shape in shapes:
        _report_shape(shape, [side for side in sides if side.shape is shape])
    if not _summary(shapes, sides):
        print("some ratio is over the guardrail", file=sys.stderr)


if __name__ == "__main__":
    main()
