"""Shared pieces of the end-to-end CLI tests: configs with test-only hooks, a runner.

Runs are real processes (``python -m flexgraph run``), launched as users launch
them; interruptions are real signals sent by a hook to its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"

TWO_EPOCHS_ITERS = 46  # 2 epochs x 23 iterations per rank (1437 samples / 2 ranks / batch 32)
TWO_EPOCHS = """
model = dict(dropout=0.0)
train_cfg = dict(max_epochs=2, val_interval=2)
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', interval=20, by_epoch=False, max_keep_ckpts=3),
    logger=dict(type='LoggerHook', interval=5))
"""
"""Config text for :func:`write_config`: two epochs, no dropout, checkpoints mid-epoch."""

KILLER = textwrap.dedent(
    '''
    """Test-only hook: SIGKILL this process at an iteration, or halfway through a save."""
    import os
    import signal
    import time

    import torch
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS


    @HOOKS.register_module(force=True)
    class KillAt(Hook):
        """``everyone=True``: the SIGKILL takes the whole run (launcher, every rank)."""

        def __init__(self, at_iter=-1, during_save=-1, rank=0, everyone=False):
            self.at_iter, self.during_save, self.rank = at_iter, during_save, rank
            self.everyone = everyone
            self.saves = 0

        def _mine(self, runner):
            return runner.rank == self.rank

        def before_train(self, runner):
            os.makedirs(runner.work_dir, exist_ok=True)
            with open(os.path.join(runner.work_dir, f"pid-rank{runner.rank}"), "w") as f:
                f.write(str(os.getpid()))

        def _victims(self, runner):
            if not self.everyone:
                return [os.getpid()]
            pids = [int(os.environ["FLEXGRAPH_LAUNCHER"])] if runner.world_size > 1 else []
            for r in range(runner.world_size):
                with open(os.path.join(runner.work_dir, f"pid-rank{r}")) as f:
                    pids.append(int(f.read()))
            return sorted(pids, key=lambda pid: pid == os.getpid())  # this process last

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if self._mine(runner) and runner.iter + 1 == self.at_iter:
                for pid in self._victims(runner):
                    os.kill(pid, signal.SIGKILL)

        def before_save_checkpoint(self, runner, checkpoint):
            self.saves += 1
            if self._mine(runner) and self.saves == self.during_save:
                victims = self._victims(runner)
                def half_then_die(obj, f, *args, **kwargs):
                    f.write(b"PK\\x03\\x04 half a checkpoint")
                    f.flush()
                    for pid in victims:
                        os.kill(pid, signal.SIGKILL)
                torch.save = half_then_die


    @HOOKS.register_module(force=True)
    class SignalAt(Hook):
        """Sends ``sig`` once ``at_iter`` iterations are done, from rank ``rank``.

        ``to='launcher'`` signals the process that launched the ranks (as a scheduler
        or Ctrl-C does) and waits a second, so that the launcher's forwarded signal
        reaches every rank before any goes past the next collective: the iteration
        the ranks stop at is then known. ``to='self'`` signals only this rank.
        ``again=True``: rank 0 signals itself once more right before each save from
        then on (a second signal while the checkpoint is written).
        """

        def __init__(self, at_iter=-1, sig="SIGTERM", to="launcher", rank=0, again=False):
            self.at_iter, self.sig, self.to, self.rank = at_iter, sig, to, rank
            self.again = again

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.rank == self.rank and runner.iter + 1 == self.at_iter:
                target = (int(os.environ["FLEXGRAPH_LAUNCHER"]) if self.to == "launcher"
                          else os.getpid())
                os.kill(target, getattr(signal, self.sig))
                if self.to == "launcher":
                    time.sleep(1.0)

        def before_save_checkpoint(self, runner, checkpoint):
            if self.again and runner.rank == 0 and 0 < self.at_iter <= runner.iter:
                os.kill(os.getpid(), getattr(signal, self.sig))


    POINTS = [
        "before_run", "after_run", "before_train", "after_train", "before_train_epoch",
        "after_train_epoch", "before_train_iter", "after_train_iter", "before_val",
        "after_val", "before_val_epoch", "after_val_epoch", "before_val_iter",
        "after_val_iter", "before_save_checkpoint", "after_load_checkpoint",
    ]


    @HOOKS.register_module(force=True)
    class Record(Hook):
        """Appends every hook point it sees to work_dir/hooks-rank<R>.txt."""


    def _recorder(point):
        def record(self, runner, *args, **kwargs):
            os.makedirs(runner.work_dir, exist_ok=True)
            with open(os.path.join(runner.work_dir, f"hooks-rank{runner.rank}.txt"), "a") as f:
                f.write(point + "\\n")
        return record


    for _point in POINTS:
        setattr(Record, _point, _recorder(_point))


    @HOOKS.register_module(force=True)
    class EmaLoss(Hook):
        """Hook state that lives in checkpoints: an exponential average of the loss.

        It travels as a hook extra (``checkpoint['ema_loss']``); a resume that lost
        it would restart the average and end elsewhere. Written to
        work_dir/ema-rank<R>.json after training.
        """

        def __init__(self, decay=0.9):
            self.decay, self.value = decay, None

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            loss = float(outputs["loss"])
            self.value = loss if self.value is None else (
                self.decay * self.value + (1 - self.decay) * loss)

        def before_save_checkpoint(self, runner, checkpoint):
            checkpoint["ema_loss"] = self.value

        def after_load_checkpoint(self, runner, checkpoint):
            self.value = checkpoint.get("ema_loss", self.value)

        def after_train(self, runner):
            import json

            with open(os.path.join(runner.work_dir, f"ema-rank{runner.rank}.json"), "w") as f:
                json.dump({"ema_loss": self.value}, f)


    @HOOKS.register_module(force=True)
    class Inspect(Hook):
        """Writes what this rank trains with to work_dir/inspect-rank<R>.json.

        Reads FSDP2's per-module state (private attributes: the only place the
        applied policies are visible) to check that the config's options arrived.
        """

        def before_train(self, runner):
            import json

            import torch.distributed as dist

            model = runner.model
            info = {"model": type(model).__name__, "world_size": runner.world_size,
                    "backend": dist.get_backend() if dist.is_initialized() else None,
                    "optim_wrapper": type(runner.optim_wrapper).__name__,
                    "param_types": sorted({type(p).__name__ for p in model.parameters()}),
                    # this rank's part: an FSDP2 DTensor's local shard, a ZeRO-3 partition
                    "local_numel": sum(getattr(p, "ds_tensor", getattr(p, "_local_tensor", p))
                                       .numel() for p in model.parameters()),
                    "numel": sum(getattr(p, "ds_numel", p.numel())
                                 for p in model.parameters()),
                    "compute_dtype": str(getattr(model, "compute_dtype", None))}
            for attr in ("find_unused_parameters", "broadcast_buffers"):
                if hasattr(model, attr):
                    info[attr] = getattr(model, attr)
            units = [name for name, m in model.named_modules()
                     if hasattr(m, "_get_fsdp_state")]
            if units:
                state = model._get_fsdp_state()
                group = state._fsdp_param_group
                info.update(fsdp_units=units,
                            param_dtype=str(state._mp_policy.param_dtype),
                            reduce_dtype=str(state._mp_policy.reduce_dtype),
                            reshard_after_forward=group.post_forward_mesh_info is not None)
            os.makedirs(runner.work_dir, exist_ok=True)
            with open(os.path.join(runner.work_dir, f"inspect-rank{runner.rank}.json"), "w") as f:
                json.dump(info, f)
    '''
)


def write_config(folder: Path, record: bool = False, inspect: bool = False, ema: bool = False,
                 extra: str = "", **killer) -> Path:
    """A 3-epoch quickstart that checkpoints every 20 iterations (mid-epoch).

    ``record`` / ``inspect`` / ``ema`` add the hooks of those names, ``killer`` options add
    ``KillAt``, and ``extra`` is config text appended as is (a strategy, say).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "killer.py").write_text(KILLER)
    hooks = [f"dict(type='KillAt', **{killer!r})"] if killer else []
    hooks += ["dict(type='Record')"] if record else []
    hooks += ["dict(type='Inspect')"] if inspect else []
    hooks += ["dict(type='EmaLoss')"] if ema else []
    hooks = "[" + ", ".join(hooks) + "]"
    config = folder / "cfg.py"
    config.write_text(
        textwrap.dedent(
            f"""
            _base_ = [{str(QUICKSTART)!r}]
            custom_imports = dict(imports=['digits', 'killer'], allow_failed_imports=False)
            train_cfg = dict(by_epoch=True, max_epochs=3, val_interval=3)
            default_hooks = dict(
                checkpoint=dict(type='CheckpointHook', interval=20, by_epoch=False,
                                max_keep_ckpts=3),
            )
            custom_hooks = {hooks}
            """
        ) + textwrap.dedent(extra)
    )
    return config


def same_start(root: Path) -> str:
    """A ``load_from`` line for one fixed initial DigitsMLP, saved under ``root``:
    runs compared across strategies start from the same weights."""
    sys.path.insert(0, str(ROOT / "examples"))
    from digits import DigitsMLP

    torch.manual_seed(0)
    torch.save(DigitsMLP(hidden=128, dropout=0.0).state_dict(), root / "init.pth")
    return f"load_from = {str(root / 'init.pth')!r}\n"


def flexgraph_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # One thread per process, as torchrun sets for its workers: on a small shared
    # machine OpenMP spin-waiting otherwise makes tiny models many times slower.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "flexgraph", "run", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def launch_two(config: Path, work: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    """``flexgraph run CONFIG --work-dir WORK --nproc-per-node 2``, which must succeed."""
    done = flexgraph_run(str(config), "--work-dir", work, "--nproc-per-node", "2", *extra,
                         cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def train_losses(work_dir: Path) -> dict[int, float]:
    """``{iteration: loss}`` of the training records in ``work_dir/metrics.jsonl``."""
    lines = [json.loads(x) for x in (work_dir / "metrics.jsonl").read_text().splitlines()]
    return {x["iter"]: x["loss"] for x in lines if x.get("mode", "train") == "train"}


def final_state(work_dir: Path) -> dict:
    pointer = Path((work_dir / "last_checkpoint").read_text().strip())
    return torch.load(pointer, weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    assert a["meta"]["iter"] == b["meta"]["iter"]
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for pid, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(
                b["optimizer"]["state"][pid][key])), (pid, key)


def hook_trace(path: Path) -> list[str]:
    """The hook points in order; each run of train (or val) iterations becomes one entry.

    The iteration count differs between one process and two; the structure must not.
    """
    trace: list[str] = []
    for point in path.read_text().split():
        if point.endswith("_iter"):
            point = point.split("_", 1)[1] + "s*"  # before_train_iter -> train_iters*
        if not (point.endswith("*") and trace and trace[-1] == point):
            trace.append(point)
    return trace


MOMENTUM = textwrap.dedent(
    """
    import torch
    from mmengine.registry import MODELS
    from torch import nn

    from digits import DigitsMLP


    @MODELS.register_module(force=True)
    class MomentumMLP(DigitsMLP):
        \"\"\"A momentum copy of the first layer, moved towards it in place in forward
        (MoCo's habit), through the parameter or through its ``.data``.\"\"\"

        def __init__(self, through_data=False, **kwargs):
            super().__init__(**kwargs)
            self.through_data = through_data
            self.momentum = nn.Linear(64, self.net[0].out_features).requires_grad_(False)

        def forward(self, inputs, labels=None, mode="tensor"):
            with torch.no_grad():
                for mine, theirs in zip(self.momentum.parameters(), self.net[0].parameters()):
                    if self.through_data:
                        mine.data.lerp_(theirs.data, 0.1)
                    else:
                        mine.lerp_(theirs, 0.1)
            return super().forward(inputs, labels, mode)
    """
)
"""A model whose forward writes its own weights: sharding strategies lose the write."""
