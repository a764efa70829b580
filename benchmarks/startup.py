"""How long from process start to the first training iteration: ``flexgraph run`` vs a script?

A user who runs a small experiment waits for the process to start, import,
plan, build and reach its first step; on a tiny workload that wait is most of
the run. Two pairs are timed on the tiny workload (``_tiny.py``):

* the path MMEngine users take (the goal, at most 1.15x, is about this pair):
  ``flexgraph run`` of an MMEngine-style config whose model is a ``BaseModel``
  (``_tiny_mm.TinyBaseModel``) with MMEngine's default hooks (runtime info,
  timer, sampler seed, logger, parameter scheduler, checkpoint), against
  ``python benchmarks/_tiny_mm.py``, a hand-written script that builds the
  same BaseModel, data and ``OptimWrapper`` and calls ``model.train_step``;
* the plain path: a plain ``nn.Module`` config (``_tiny.TinyMLP``) against
  ``python benchmarks/_tiny.py``, a hand-written torch script that imports no
  mmengine at all (flexgraph's steps build MMEngine's optimizer wrapper, and
  ``mmengine.optim`` imports ``torch.distributed.optim``, so this pair shows
  that cost too).

Both configs load this module through ``custom_imports``, which registers the
models, the dataset and the hook ``FirstIterationStamp`` (``after_train_iter``;
a plain object, so that measuring does not import ``mmengine.hooks``).
Each child prints ``time.time()`` at the end of its first iteration and ends at
once (``os._exit(0)``: no teardown is timed); the parent takes ``time.time()``
right before ``Popen``, so each time covers interpreter start, imports, config
loading, planning, building, writing the work_dir's files and one iteration.
The flexgraph children also report whether DeepSpeed got imported; the header
says whether DeepSpeed is installed at all (``mmengine.runner`` imports it when
it is, which ``flexgraph run`` must not pay for). Then, measured the same way
(each child stamps right after its import), what the pieces cost on their
own: the bare interpreter, ``import torch``, ``import flexgraph``, ``import
mmengine.config``, ``import mmengine.model`` (which imports ``mmengine.optim``)
and ``import mmengine.runner``.

Runs alternate between the commands in rounds (``_harness.py``: the order
reversed every other round, after one warm-up round that is not counted;
ratios taken within each round), with the working directory and every
work_dir in a temporary folder; medians of ``--runs`` each. Run::

    python benchmarks/startup.py [--runs N]

``--pieces`` times instead what each piece of start-up machinery that
flexgraph keeps saves, on the paths users take:

* the garbage collector kept off what loading imports
  (``flexgraph/cli/collector.py``): ``flexgraph plan --compare`` of four
  candidates on ViT-huge/14, in turn with the collector as flexgraph sets it
  and left on (the same command, with the context manager replaced by one
  that does nothing);
* DeepSpeed's shared-memory all-reduce op, which flexgraph leaves out
  (``_leave_out_shm_all_reduce`` in ``strategies/deepspeed/steps.py``): its
  build in a fresh extensions folder (once) and its load once built, against
  ``flexgraph run examples/quickstart.py --nproc-per-node 2 --strategy
  deepspeed`` to the end of its first iteration, in turn with the loads.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import itertools
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _tiny
import _tiny_mm
from _harness import Clocks, interleave
from mmengine.registry import DATASETS, HOOKS, MODELS

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300  # per child, so a hung child fails the benchmark instead of hanging it
# Imported alone, to show where the startup goes.
IMPORTS = (None, "torch", "flexgraph", "mmengine.config", "mmengine.model", "mmengine.runner")
ROOT = HERE.parent
VIT_COMPARE = [str(ROOT / "examples" / "estimate" / "vit_huge_p14_8xb128_ddp.py"), "--compare",
               "ddp,ddp:fp16,deepspeed:zero1:fp16,deepspeed:zero3:fp16"]
# ``flexgraph`` with the collector left on: what --pieces compares the collector with.
COLLECTOR_LEFT_ON = """import contextlib, sys
import flexgraph.cli.collector as collector
@contextlib.contextmanager
def left_on():
    yield lambda: None
collector.imports_kept_from_collector = left_on
from flexgraph.cli.main import run_and_exit
run_and_exit()
"""
# Build (or load, once built) DeepSpeed's shared-memory all-reduce op; print the seconds.
SHM_OP = """import time, deepspeed
builder = deepspeed.accelerator.get_accelerator().create_op_builder("ShareMemCommBuilder")
start = time.time()
builder.load()
print(time.time() - start)
"""
DEEPSPEED_LINE = "deepspeed-imported"

# What the flexgraph children's configs import (custom_imports) finds here.
MODELS.register_module(module=_tiny.TinyMLP, force=True)
MODELS.register_module(module=_tiny_mm.TinyBaseModel, force=True)
DATASETS.register_module(module=_tiny.TinyData, force=True)

# MMEngine's default hooks, as its default runtime config lists them.
MMENGINE_DEFAULT_HOOKS = dict(
    runtime_info=dict(type="RuntimeInfoHook"),
    timer=dict(type="IterTimerHook"),
    sampler_seed=dict(type="DistSamplerSeedHook"),
    logger=dict(type="LoggerHook", interval=50),
    param_scheduler=dict(type="ParamSchedulerHook"),
    checkpoint=dict(type="CheckpointHook", interval=1),
)


@HOOKS.register_module(force=True)
class FirstIterationStamp:
    """Says whether DeepSpeed was imported, prints the times and ends the process.

    A plain object with a hook method, which flexgraph accepts as a hook: being
    instrumentation, it must not add an import (``mmengine.hooks``) of its own
    to the path it measures, whose hooks are all MMEngine's built-in defaults.
    """

    priority = "NORMAL"

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        print(DEEPSPEED_LINE, "deepspeed" in sys.modules, flush=True)
        _tiny.stamp()


def _shown(module: str | None) -> str:
    return f'python -c "import {module}"' if module else "python (imports nothing)"


def _import_only(module: str | None) -> list[str]:
    """A child that imports ``module`` (or nothing) and then stamps like the others."""
    code = f"import {module}; " if module else ""
    code += (f"import os, time; print({_tiny.STAMP!r}, repr(time.time()), "
             f"repr(time.process_time()), flush=True); os._exit(0)")
    return [sys.executable, "-c", code]


def _time_to_stamp(argv: list[str], cwd: str, env: dict[str, str],
                   deepspeed_seen: set[str]) -> Clocks:
    """Wall seconds from right before ``Popen`` to the stamp, and the child's CPU seconds."""
    start = time.time()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    stamps = [line.split()[1:3] for line in out.splitlines() if line.startswith(_tiny.STAMP)]
    if child.returncode != 0 or not stamps:
        tail = "\n".join((out + err).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(argv)} exited {child.returncode} without a stamp:\n{tail}")
    deepspeed_seen.update(line.split()[1] for line in out.splitlines()
                          if line.startswith(DEEPSPEED_LINE))
    wall, cpu = stamps[0]
    return Clocks(float(wall) - start, float(cpu))


def _write_config(folder: Path, name: str, model: str) -> Path:
    """The tiny config as a cfg.py file, loading this module through custom_imports."""
    cfg = _tiny.config(str(folder / "work"), 1000, model=model,  # each run: its own --work-dir
                       custom_hooks=[dict(type="FirstIterationStamp")])
    if model == "TinyBaseModel":  # the MMEngine user's config: default hooks, INFO logs
        cfg["default_hooks"] = MMENGINE_DEFAULT_HOOKS
        cfg["train_dataloader"]["collate_fn"] = dict(type="default_collate")
        del cfg["log_level"]
    cfg = {"custom_imports": dict(imports=[Path(__file__).stem],
                                  allow_failed_imports=False), **cfg}
    path = folder / f"{name}.py"
    path.write_text("".join(f"{key} = {value!r}\n" for key, value in cfg.items()))
    return path


def _deepspeed() -> str:
    """Whether DeepSpeed is importable here (looked up, not imported: that takes seconds)."""
    if importlib.util.find_spec("deepspeed") is None:
        return "not installed"
    return f"installed ({importlib.metadata.version('deepspeed')})"


PAIRS = (  # (flexgraph's command, the hand-written script it is compared with)
    ("flexgraph run, BaseModel", "hand script, BaseModel"),
    ("flexgraph run, nn.Module", "hand script, plain torch"),
)


def _plan_time(argv: list[str], cwd: str) -> Clocks:
    """Wall and CPU seconds of one ``flexgraph plan`` process, start to exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True, timeout=TIMEOUT_S)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Clocks(time.time() - start, after.ru_utime + after.ru_stime
                  - before.ru_utime - before.ru_stime)


def _shm_op_seconds(extensions: str) -> float:
    """Seconds to build or load DeepSpeed's shared-memory op in the ``extensions`` folder."""
    done = subprocess.run([sys.executable, "-c", SHM_OP], capture_output=True, text=True,
                          check=True, timeout=3600,
                          env={**os.environ, "TORCH_EXTENSIONS_DIR": extensions})
    return float(done.stdout.split()[-1])


def pieces(runs: int, env: dict[str, str]) -> None:
    """``--pieces``: what each kept piece of start-up machinery saves (module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = [sys.executable, "-m", "flexgraph", "plan", *VIT_COMPARE]
        left_on = [sys.executable, "-c", COLLECTOR_LEFT_ON, "plan", *VIT_COMPARE]
        rounds = interleave({"collector kept off the imports": lambda: _plan_time(plan, tmp),
                             "collector left on": lambda: _plan_time(left_on, tmp)}, runs)
        print(f"flexgraph plan --compare (ViT-huge/14, 4 candidates), median of {runs} runs "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        for name in rounds.values:
            print(f"  {name:<32} {rounds.of(name, 'wall').median:6.2f} s  "
                  f"CPU {rounds.of(name, 'cpu').median:6.2f} s")
        for clock in ("wall", "cpu"):
            print(f"  left on / kept off, {clock}: "
                  f"{rounds.ratio('collector left on', 'collector kept off the imports', clock)}")

        config = Path(tmp) / "quickstart_stamp.py"
        config.write_text((ROOT / "examples" / "quickstart.py").read_text()
                          + "custom_imports = dict(imports=['digits', 'startup'], "
                          "allow_failed_imports=False)\n"
                          "custom_hooks = [dict(type='FirstIterationStamp')]\n")
        ranks_env = {**env, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples"),
                                                           env["PYTHONPATH"]])}
        extensions = f"{tmp}/torch_extensions"
        build = _shm_op_seconds(extensions)
        runs_made = itertools.count()
        rounds = interleave({
            "run": lambda: _first_stamp(
                [sys.executable, "-m", "flexgraph", "run", str(config), "--nproc-per-node",
                 "2", "--strategy", "deepspeed", "--work-dir", f"{tmp}/ds_{next(runs_made)}"],
                tmp, ranks_env),
            "load": lambda: _shm_op_seconds(extensions)}, runs)
        run = rounds.of("run").median
        print(f"flexgraph run examples/quickstart.py --nproc-per-node 2 --strategy deepspeed: "
              f"{run:.2f} s to the first iteration, median of {runs}")
        print(f"  DeepSpeed's shared-memory op: built in {build:.2f} s once per environment "
              f"({build / run:.2f}x the run), loaded in {rounds.of('load').median:.2f} s "
              f"by each rank ({rounds.of('load').median / run:.3f}x the run)")


def _first_stamp(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    """Wall seconds from ``Popen`` to the first rank's stamp; the run is then ended."""
    start = time.time()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in child.stdout:
            if line.startswith(_tiny.STAMP):
                return float(line.split()[1]) - start
        raise RuntimeError(f"{' '.join(argv)} exited {child.wait()} without a stamp")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command")
    parser.add_argument("--pieces", action="store_true",
                        help="time what the kept start-up machinery saves instead")
    args = parser.parse_args()
    env = dict(os.environ)
    # Where the configs' custom_imports find this module (and it finds _tiny).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    if args.pieces:
        pieces(args.runs, env)
        return
    deepspeed_seen: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        base_model = _write_config(Path(tmp), "tiny_basemodel_cfg", "TinyBaseModel")
        plain = _write_config(Path(tmp), "tiny_cfg", "TinyMLP")
        runs = itertools.count()

        def flexgraph_run(config: Path) -> list[str]:
            return [sys.executable, "-m", "flexgraph", "run", str(config),
                    "--work-dir", f"{tmp}/work_{next(runs)}"]

        commands = {
            PAIRS[0][0]: functools.partial(flexgraph_run, base_model),
            PAIRS[0][1]: lambda: [sys.executable, str(HERE / "_tiny_mm.py")],
            PAIRS[1][0]: functools.partial(flexgraph_run, plain),
            PAIRS[1][1]: lambda: [sys.executable, str(HERE / "_tiny.py")],
            **{_shown(module): functools.partial(_import_only, module) for module in IMPORTS},
        }
        rounds = interleave({name: (lambda name=name: _time_to_stamp(
            commands[name](), tmp, env, deepspeed_seen)) for name in commands}, args.runs)

    imported = {"True": "yes", "False": "no"}
    print(f"process start -> end of the first training iteration, median of {args.runs} "
          f"runs (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"DeepSpeed: {_deepspeed()}; imported by flexgraph run: "
          f"{' / '.join(imported[seen] for seen in sorted(deepspeed_seen)) or '?'}")
    for ours, hand in PAIRS:
        for name in (ours, hand):
            print(f"  {name:<28} {rounds.of(name, 'wall').median:6.3f} s  "
                  f"CPU {rounds.of(name, 'cpu').median:6.3f} s  "
                  f"(runs: {' '.join(f'{t:.3f}' for t in rounds.series(name, 'wall'))})")
        extra = rounds.of(ours, "wall").median - rounds.of(hand, "wall").median
        goal = "  (goal <= 1.15)" if ours == PAIRS[0][0] else ""
        print(f"ratio {ours} / {hand}: {rounds.ratio(ours, hand, 'wall').median:.2f} "
              f"({extra:+.3f} s), CPU {rounds.ratio(ours, hand, 'cpu').median:.2f}{goal}")
    print("where it goes: the same measurement, each child stamping right after its import")
    for name in map(_shown, IMPORTS):
        print(f"  {name:<34} {rounds.of(name, 'wall').median:6.3f} s")


if __name__ == "__main__":
    main()
