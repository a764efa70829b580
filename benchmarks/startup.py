"""How long from process start to the first training iteration: ``flexgraph run`` vs a script?

A user who runs a small experiment waits for the process to start, import,
plan, build and reach its first step; on a tiny workload that wait is most of
the run. This compares, on the tiny workload of ``_tiny.py``:

* ``flexgraph run``: the real CLI, ``python -m flexgraph run tiny_cfg.py
  --work-dir D``, on an MMEngine-style config (``_tiny.config``) whose
  ``custom_imports`` loads this module, which registers the model, the dataset
  and the hook ``FirstIterationStamp`` (``after_train_iter``);
* ``hand script``: ``python benchmarks/_tiny.py``, a hand-written script that
  imports torch, builds the same model, data and optimizer and trains one
  iteration (``loss.item()`` included, as a real script logs it).

Each child prints ``time.time()`` at the end of its first iteration and ends at
once (``os._exit(0)``: no teardown is timed); the parent takes ``time.time()``
right before ``Popen``, so each time covers interpreter start, imports, config
loading, planning, building and one iteration. Then, measured the same way
(each child stamps right after its import), what the pieces cost on their own:
the bare interpreter, ``import torch``, ``import flexgraph``, ``import
mmengine.config`` and ``import mmengine.hooks`` (mmengine's components, which
flexgraph's steps import: they bring torch and much of torch.distributed), so a
reader sees where the startup goes.

Runs alternate between the commands (order reversed every other round, after
one warm-up round that is not counted), with the working directory and every
work_dir in a temporary folder; medians of ``--runs`` each. Run::

    python benchmarks/startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _tiny
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS, MODELS

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300  # per child, so a hung child fails the benchmark instead of hanging it
# Imported alone, to show where the startup goes. mmengine.hooks stands for
# mmengine's component modules (hooks, model, optim, ...), which flexgraph's
# training steps import to register them, and which import torch.distributed.
IMPORTS = (None, "torch", "flexgraph", "mmengine.config", "mmengine.hooks")

# What the flexgraph child's config imports (custom_imports) finds here.
MODELS.register_module(module=_tiny.TinyMLP, force=True)
DATASETS.register_module(module=_tiny.TinyData, force=True)


@HOOKS.register_module(force=True)
class FirstIterationStamp(Hook):
    """Prints the wall-clock time after the first training iteration and ends the process."""

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        _tiny.stamp()


def _shown(module: str | None) -> str:
    return f'python -c "import {module}"' if module else "python (imports nothing)"


def _import_only(module: str | None) -> list[str]:
    """A child that imports ``module`` (or nothing) and then stamps like the others."""
    code = f"import {module}; " if module else ""
    code += f"import os, time; print({_tiny.STAMP!r}, repr(time.time()), flush=True); os._exit(0)"
    return [sys.executable, "-c", code]


def _time_to_stamp(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    """Seconds from right before ``Popen`` to the time the child printed."""
    start = time.time()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    stamps = [line.split()[1] for line in out.splitlines() if line.startswith(_tiny.STAMP)]
    if child.returncode != 0 or not stamps:
        tail = "\n".join((out + err).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(argv)} exited {child.returncode} without a stamp:\n{tail}")
    return float(stamps[0]) - start


def _write_config(folder: Path) -> Path:
    """The tiny config as a cfg.py file, loading this module through custom_imports."""
    cfg = _tiny.config(str(folder / "work"), 1000,  # each run passes its own --work-dir
                       custom_hooks=[dict(type="FirstIterationStamp")])
    cfg = {"custom_imports": dict(imports=[Path(__file__).stem],
                                  allow_failed_imports=False), **cfg}
    path = folder / "tiny_cfg.py"
    path.write_text("".join(f"{key} = {value!r}\n" for key, value in cfg.items()))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command")
    args = parser.parse_args()
    env = dict(os.environ)
    # Where the config's custom_imports finds this module (and it finds _tiny).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        config = _write_config(Path(tmp))
        runs = itertools.count()
        commands = {
            "flexgraph run": lambda: [sys.executable, "-m", "flexgraph", "run", str(config),
                                      "--work-dir", f"{tmp}/work_{next(runs)}"],
            "hand script": lambda: [sys.executable, str(HERE / "_tiny.py")],
            **{_shown(module): functools.partial(_import_only, module) for module in IMPORTS},
        }
        seconds: dict[str, list[float]] = {name: [] for name in commands}
        for round_ in range(-1, args.runs):  # round -1 warms the file cache, not counted
            order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
            for name in order:
                elapsed = _time_to_stamp(commands[name](), tmp, env)
                if round_ >= 0:
                    seconds[name].append(elapsed)

    median = {name: statistics.median(times) for name, times in seconds.items()}
    print(f"process start -> end of the first training iteration, median of {args.runs} "
          f"runs (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    for name in ("flexgraph run", "hand script"):
        print(f"  {name:<24} {median[name]:6.3f} s   "
              f"(runs: {' '.join(f'{t:.3f}' for t in seconds[name])})")
    extra = median["flexgraph run"] - median["hand script"]
    print(f"ratio flexgraph/hand: {median['flexgraph run'] / median['hand script']:.2f} "
          f"({extra:+.3f} s)")
    print("where it goes: the same measurement, each child stamping right after its import")
    for name in map(_shown, IMPORTS):
        print(f"  {name:<34} {median[name]:6.3f} s")


if __name__ == "__main__":
    main()
