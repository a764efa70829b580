"""How much does flexgraph's training loop cost per iteration over a hand-written one?

The workload (``_tiny.py``) is deliberately tiny (an MLP step takes about a
millisecond on one CPU thread) so that any per-iteration overhead of the
runtime shows. Three comparisons, each flexgraph against the hand-written loop
a user would otherwise write for the same model:

* ``plain``: a plain ``nn.Module`` whose forward returns the loss. Hand:
  ``for x, y in loader: zero_grad / forward / backward / step`` plus
  ``loss.item()`` for logging, as a real hand-written loop does.
* ``model API``: the path MMEngine users take. An MMEngine ``BaseModel``
  (data preprocessor, ``train_step``), samples as dicts collated by
  ``pseudo_collate``, an ``OptimWrapper`` and MMEngine's default hooks. Hand: a
  loop calling the same ``model.train_step(batch, optim_wrapper)`` on the same
  dataloader, plus ``.item()`` of the logged loss.
* ``terminal``: the plain comparison again with both sides under a
  pseudo-terminal, so flexgraph draws its progress bar; the CPU time of
  every thread counts.

flexgraph runs as ``flexgraph run cfg.py`` (the CLI's entry point, called in the measuring
process), with a log line every 50 iterations at the INFO level, metrics.jsonl
and the work_dir record on, checkpointing off. TensorBoard is off, as in
MMEngine's default config; ``--tensorboard`` adds a ``TensorboardVisBackend``
to flexgraph's config (the hand loops write no TensorBoard either way).

Method: every measurement is a whole, fresh process (``--child``). It trains
once to warm up, then runs the whole thing (build, then train) for
``--epochs`` LO and for HI epochs of ``--iters`` iterations, ``--repeats``
times each (alternating; the fastest of each counts, as interference only ever
adds time), and reports ``(t_HI - t_LO) / ((HI - LO) * iters)``: the cost of
one more iteration, with imports, setup and every per-run cost cancelled.
The default, 1 and 7 epochs of 200 iterations, puts 1,200 iterations in the
slope: the run-to-run jitter of flexgraph's setup (config, plan, work_dir
files) weighs half what it did over the 600 of 1 and 4 epochs, while each
epoch keeps its per-epoch work (a new data iterator, the epoch's last line).
The two processes of a comparison run side by side: both pinned to the same
CPU (a different one every round), each warms up, and both start timing
together, so that they share that CPU and whatever else the machine runs on it
(``--pairing own-cpu`` gives each its own CPU, ``sequential`` runs them one
after the other). Each round's flexgraph/hand ratio is taken on the pair; the
figure is the median over rounds, with the spread. Both process CPU time (less
disturbed by other processes) and wall time are reported. Run::

    python benchmarks/loop_overhead.py [--rounds R] [--iters N] [--epochs LO,HI]
                                       [--repeats K] [--only plain,api,terminal]
                                       [--with-mmengine] [--tensorboard]

``--with-mmengine`` adds MMEngine's ``FlexibleRunner`` on the model-API config.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import statistics
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
from _tiny import BATCH, TinyData, TinyMLP  # noqa: E402

ROUNDS = 8
_TENSORBOARD_ENV = "LOOP_OVERHEAD_TENSORBOARD"  # --tensorboard, as the children see it
TIMEOUT_S = 600  # per child: a hung child fails the benchmark instead of hanging it
# The comparisons: name -> (hand variant, flexgraph variant, under a pseudo-terminal)
COMPARISONS = {
    "plain": ("hand-plain", "flexgraph-plain", False),
    "api": ("hand-api", "flexgraph-api", False),
    "terminal": ("hand-plain", "flexgraph-plain", True),
    # the hand loop against itself: the method's own noise and bias on this machine
    "calibrate": ("hand-plain", "hand-plain-again", False),
}


# -- the model-API workload (MMEngine's BaseModel contract) -------------------------------

def _register() -> None:
    """Register the workload's components in MMEngine's registries (children only)."""
    from mmengine.model import BaseModel
    from mmengine.registry import DATASETS, MODELS

    class TinyBaseModel(BaseModel):
        """The same MLP behind MMEngine's BaseModel contract: ``forward(inputs,
        data_samples, mode)``; lists of samples (``pseudo_collate``) are stacked."""

        def __init__(self, data_preprocessor: Any = None) -> None:
            super().__init__(data_preprocessor=data_preprocessor)
            self.net = _tiny.mlp()

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

    MODELS.register_module(module=TinyMLP, force=True)
    MODELS.register_module(module=TinyBaseModel, force=True)
    DATASETS.register_module(module=TinyData, force=True)
    DATASETS.register_module(module=TinyDictData, force=True)


def _config(work_dir: str, iters: int, epochs: int, api: bool) -> dict[str, Any]:
    cfg = _tiny.config(work_dir, iters, model="TinyBaseModel" if api else "TinyMLP")
    cfg["train_cfg"]["max_epochs"] = epochs
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

def hand_plain(iters: int, epochs: int, work_dir: str) -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(TinyData(iters * BATCH), batch_size=BATCH,
                                         shuffle=True)
    logged = []
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            logged.append(loss.item())


def hand_api(iters: int, epochs: int, work_dir: str) -> None:
    from mmengine.dataset import DefaultSampler, pseudo_collate
    from mmengine.optim import OptimWrapper
    from mmengine.registry import DATASETS, MODELS

    torch.manual_seed(0)
    model = MODELS.build(dict(type="TinyBaseModel"))
    optim_wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    dataset = DATASETS.build(dict(type="TinyDictData", n=iters * BATCH))
    sampler = DefaultSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                         collate_fn=pseudo_collate)
    model.train()
    logged = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            log_vars = model.train_step(batch, optim_wrapper)
            logged.append(log_vars["loss"].item())


def flexgraph_run(iters: int, epochs: int, work_dir: str, api: bool) -> None:
    """``flexgraph run cfg.py``: the CLI's own entry point, in this process.

    Everything a user's run does (load the config file, plan, print the plan
    and the setup timings, record the run in the work_dir, train with the
    console output on) except starting the interpreter, which the slope
    cancels anyway.
    """
    from mmengine.config import Config

    from flexgraph.cli.main import main as flexgraph_main

    cfg = _config(work_dir, iters, epochs, api)
    cfg["log_level"] = "INFO"  # the default a user runs with: log lines are printed
    # The hand loops train on the CPU, so flexgraph must too where CUDA exists.
    cfg["strategy"] = dict(type="single", device="cpu")
    path = Path(work_dir).with_suffix(".py")
    Config(cfg).dump(str(path))
    if flexgraph_main(["run", str(path), "--work-dir", work_dir]) != 0:
        raise RuntimeError(f"flexgraph run {path} failed")


def mmengine_run(iters: int, epochs: int, work_dir: str) -> None:
    """MMEngine's FlexibleRunner (the runner flexgraph succeeds) on the model-API config."""
    from mmengine.runner import FlexibleRunner

    cfg = _config(work_dir, iters, epochs, api=True)
    cfg["default_hooks"]["checkpoint"] = dict(type="CheckpointHook", interval=-1,
                                              save_last=False)
    FlexibleRunner(**cfg, strategy=dict(type="SingleDeviceStrategy"),
                   experiment_name=f"bench_{epochs}_{time.monotonic_ns()}").train()


VARIANTS = {
    "hand-plain": hand_plain,
    "hand-plain-again": hand_plain,
    "hand-api": hand_api,
    "flexgraph-plain": lambda i, e, d: flexgraph_run(i, e, d, api=False),
    "flexgraph-api": lambda i, e, d: flexgraph_run(i, e, d, api=True),
    "mmengine-api": mmengine_run,
}


def measure(variant: str, iters: int, epochs: tuple[int, int], repeats: int,
          result: str, wait: bool) -> None:
    """One measurement: warm up, then time LO and HI epochs; write the slope.

    Each epoch count runs ``repeats`` times (alternating LO and HI) and keeps its
    fastest time: interference from other processes only ever adds time. With
    ``wait``, the timing starts when the parent says so (``{result}.go``
    exists), after both processes of a pair are warm (``{result}.ready``).
    """
    torch.set_num_threads(1)  # every side alike: no OpenMP oversubscription on few cores
    _register()
    run = VARIANTS[variant]
    times: dict[int, list[tuple[float, float]]] = {n: [] for n in epochs}
    with tempfile.TemporaryDirectory() as tmp:
        run(iters, 1, f"{tmp}/warm")
        if wait:
            Path(f"{result}.ready").touch()
            while not Path(f"{result}.go").exists():
                time.sleep(0.005)
        for i in range(repeats):
            for n in epochs:
                wall, cpu = time.perf_counter(), time.process_time()
                run(iters, n, f"{tmp}/run_{i}_{n}")
                times[n].append((time.perf_counter() - wall, time.process_time() - cpu))
    lo, hi = epochs
    extra = (hi - lo) * iters
    slope = {clock: (min(t[k] for t in times[hi]) - min(t[k] for t in times[lo])) / extra * 1e3
             for k, clock in enumerate(("wall", "cpu"))}
    Path(result).write_text(json.dumps({"variant": variant, "ms_per_iter": slope,
                                        "tty": sys.stdout.isatty()}))


# -- the parent: processes side by side ----------------------------------------------------

class _Child:
    """One measuring process, started now, with its stdout a pipe or a pseudo-terminal."""

    def __init__(self, variant: str, args: argparse.Namespace, tty: bool, tmp: str,
                 cpu: int | None) -> None:
        self.variant, self.tty = variant, tty
        self.result = Path(tempfile.mktemp(dir=tmp, suffix=".json"))
        self.command = [sys.executable, __file__, "--child", variant, "--iters",
                        str(args.iters), "--epochs", args.epochs, "--repeats",
                        str(args.repeats), "--result", str(self.result)]
        if cpu is not None:  # a paired run: pinned, and timed when both are ready
            self.command += ["--cpu", str(cpu), "--wait"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
               _TENSORBOARD_ENV: "1" if args.tensorboard else "0"}
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


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} (min {min(values):.3f}, " \
           f"max {max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--iters", type=int, default=200, help="iterations per epoch")
    parser.add_argument("--epochs", default="1,7", help="LO,HI epochs of each timed pair")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each epoch count per process (the fastest counts)")
    parser.add_argument("--only", default="plain,api,terminal",
                        help="comma-separated comparisons to run: plain, api, terminal, "
                             "calibrate (the hand loop against itself)")
    parser.add_argument("--with-mmengine", action="store_true",
                        help="also time MMEngine's FlexibleRunner on the model-API config")
    parser.add_argument("--tensorboard", action="store_true",
                        help="flexgraph's runs write TensorBoard scalars too")
    parser.add_argument("--pairing", choices=("same-cpu", "own-cpu", "sequential"),
                        default="same-cpu",
                        help="the two processes of a pair share one CPU at once (default), "
                             "get one each, or run one after the other")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--wait", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lo, hi = (int(n) for n in args.epochs.split(","))
    if args.child:
        if args.cpu is not None:
            os.sched_setaffinity(0, {args.cpu})
        measure(args.child, args.iters, (lo, hi), args.repeats, args.result, args.wait)
        return
    cpus = sorted(os.sched_getaffinity(0))

    chosen = [c for c in args.only.split(",") if c]
    sides = [(name, *COMPARISONS[name]) for name in chosen]
    if args.with_mmengine:
        sides.append(("mmengine", "hand-api", "mmengine-api", False))
    measured: dict[tuple[str, bool], list[dict[str, float]]] = {}
    ratios: dict[str, dict[str, list[float]]] = {name: {"cpu": [], "wall": []}
                                                for name, *_ in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, hand, other, tty in sides:
                pair = [hand, other] if round_ % 2 == 0 else [other, hand]
                if args.pairing == "sequential":  # one after the other, order alternating
                    got = {v: _Child(v, args, tty, tmp, None).finish() for v in pair}
                else:  # at once: sharing one CPU, or one CPU each (swapped every round)
                    cpu = cpus[round_ % len(cpus)]
                    where = ([cpu, cpu] if args.pairing == "same-cpu"
                             else [cpus[(round_ + i) % len(cpus)] for i in range(2)])
                    children = [_Child(v, args, tty, tmp, c)
                                for c, v in zip(where, pair, strict=True)]
                    while not all(proc.ready() for proc in children):
                        time.sleep(0.01)
                    for proc in children:  # both warm: time them side by side
                        proc.go()
                    got = {proc.variant: proc.finish() for proc in children}
                for variant, value in got.items():
                    measured.setdefault((variant, tty), []).append(value)
                for clock in ("cpu", "wall"):
                    ratios[name][clock].append(got[other][clock] / got[hand][clock])
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    print(f"{args.iters} iterations per epoch, epochs {lo} and {hi} per process, "
          f"{args.rounds} rounds, batch {BATCH}, torch {torch.__version__}, 1 thread, "
          f"TensorBoard {'on' if args.tensorboard else 'off'}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("ms per iteration (slope between the two epoch counts):")
    for (variant, tty), values in measured.items():
        where = " (terminal)" if tty else ""
        for clock in ("cpu", "wall"):
            print(f"  {variant + where:>28} {clock:>4}: "
                  f"{_spread([v[clock] for v in values])}")
    for name, hand, other, tty in sides:
        goal = "  (goal <= 1.03)" if name in ("plain", "api", "terminal") else ""
        print(f"ratio {other}/{hand}{' on a terminal' if tty else ''}: "
              f"CPU {_spread(ratios[name]['cpu'])}{goal}")
        print(f"{'':>{len('ratio ' + other + hand) + 1}}  wall {_spread(ratios[name]['wall'])}")
    if "plain" in chosen and "terminal" in chosen:
        plain = statistics.median(v["cpu"] for v in measured[("flexgraph-plain", False)])
        term = statistics.median(v["cpu"] for v in measured[("flexgraph-plain", True)])
        print(f"flexgraph-plain on a terminal / without one: CPU {term / plain:.3f}")


if __name__ == "__main__":
    main()
