"""The watchdog's parts that need no second process: its report, its folder, its own view of
a thread's stack, and a stall of a single process, in a thread of this one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from flexgraph.cli.watch_folder import WatchFolder, remove_other_runs, remove_run
from flexgraph.cli.watchdog import (
    EXIT_STALLED,
    compose_report,
    failure_line,
    innermost_user_frame,
)

STACKS = Path("/w/run/stacks")


def _beat(iteration: int, where: str, waiting: bool, since: float = 100.0, **more) -> dict:
    return {"since": since, "beat": 119.0, "iteration": iteration, "step": "train",
            "where": where, "waiting": waiting, "phase": "iteration", **more}


def test_the_ranks_not_waiting_in_a_collective_are_the_stuck_ones():
    beats = {0: _beat(6, "graph.py:823 _engine_run_backward", True),
             1: _beat(5, "hooks.py:42 after_train_iter", False, since=98.0),
             2: _beat(6, "distributed_c10d.py:2801 all_reduce", True)}
    report = compose_report(beats, 3, [0, 1, 2], [], 120.0, STACKS)
    assert report["stuck"] == [1]
    assert report["line"] == ("rank 1 made no progress for 22 s at iteration 5, in "
                              "hooks.py:42 after_train_iter (stacks of every rank: "
                              "/w/run/stacks/)")


def test_in_a_deadlock_every_rank_is_named():
    waiting = {r: _beat(5, "distributed_c10d.py:4120 barrier", True) for r in range(2)}
    report = compose_report(waiting, 2, [0, 1], [], 120.0, STACKS)
    assert report["stuck"] == [0, 1]
    assert report["line"].startswith("every rank waits in a collective that another never "
                                     "joined: rank 0 made no progress for 20 s at iteration 5")
    blocked = {r: _beat(5, "locks.py:7 acquire", False) for r in range(2)}
    line = compose_report(blocked, 2, [0, 1], [], 120.0, STACKS)["line"]
    assert line.startswith("rank 0 made no progress for 20 s at iteration 5, in locks.py:7 "
                           "acquire; rank 1 made no progress")


def test_a_rank_that_wrote_no_stack_is_not_responding_and_a_vanished_one_is_gone():
    beats = {0: _beat(6, "graph.py:823 _engine_run_backward", True),
             1: {"since": 90.0, "beat": 101.0, "step": "train", "iteration": None},
             2: _beat(6, "graph.py:823 _engine_run_backward", True)}
    report = compose_report(beats, 3, [0], [2], 120.0, STACKS)
    assert report["stuck"] == [1, 2]
    assert report["line"] == (
        "rank 1 is not responding: no heartbeat for 19 s, last seen in step 'train' (a "
        "stopped process, or one stuck outside Python: it wrote no stack); rank 2 is gone: "
        "its process ended without a word (killed?), last seen at iteration 6 (stacks of the "
        "ranks that answered: /w/run/stacks/)")


def test_a_stall_outside_training_names_the_step_and_what_it_was_doing():
    beats = {0: {"since": 0.0, "step": "resume", "iteration": None, "phase": "save",
                 "where": "io.py:3 read", "waiting": False}}
    line = compose_report(beats, 1, [0], [], 1900.0, STACKS)["line"]
    assert line.startswith("rank 0 made no progress for 1900 s in step 'resume', saving a "
                           "checkpoint, in io.py:3 read")


def test_a_failure_reads_as_the_launcher_says_it():
    crash = {"status": 1, "error": "RuntimeError: boom", "step": "train", "iteration": 6}
    assert failure_line(1, crash) == ("rank 1 failed in step 'train' after 6 iterations: "
                                      "RuntimeError: boom")
    bad = {"status": 2, "message": "step 'build_model': no model 'Foo'", "error": "x"}
    assert failure_line(0, bad) == "step 'build_model': no model 'Foo'"


def test_the_innermost_frame_of_the_users_code_is_found_below_the_libraries():
    import json

    seen = {}

    def mine():
        frames = []
        frame = sys._getframe()
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        library = os.path.join(os.path.dirname(__file__), "")
        seen["user"] = innermost_user_frame(frames, (os.path.dirname(json.__file__),))
        seen["none"] = innermost_user_frame(frames, ("/", library))

    mine()
    assert seen["user"].startswith("test_watchdog_report.py:") and seen["user"].endswith(" mine")
    assert seen["none"].endswith(" mine"), "every frame a library's: the innermost one"


def test_the_folder_keeps_a_runs_records_and_one_claim(tmp_path):
    folder = WatchFolder.of_run(tmp_path, "slurm-7.0", 1, environ={"SLURM_RESTART_COUNT": "2"})
    assert folder.path == tmp_path / ".watchdog" / "slurm-7.0.requeue2" / "attempt1"
    folder.make()
    assert folder.claim(0) and not folder.claim(1)
    assert folder.read_claim()["rank"] == 0
    folder.write_failure(1, {"status": 1, "time": 5.0})
    folder.write_report({"line": "rank 1 ...", "stuck": [1]})
    assert sorted(folder.events()) == ["claim", "failed-rank1", "report"]
    assert folder.read_failures() == {1: {"status": 1, "time": 5.0}}
    assert folder.read_report()["stuck"] == [1]
    folder.stacks_path(0).write_text("stack")
    folder.stacks_path(1).write_text("")
    copied = folder.copy_stacks(tmp_path / "run" / "stacks")
    assert sorted(p.name for p in copied.iterdir()) == ["rank0.txt"]  # the empty one is not


def test_the_owner_clears_the_folders_of_other_runs_and_its_own_when_it_ended_well(tmp_path):
    for run in ("host-1", "host-2"):
        WatchFolder.of_run(tmp_path, run, environ={}).make()
    remove_other_runs(tmp_path, "host-2")
    assert [p.name for p in (tmp_path / ".watchdog").iterdir()] == ["host-2"]
    remove_run(tmp_path, "host-2")
    assert not (tmp_path / ".watchdog").exists()


_FAILING_RANK = textwrap.dedent("""
    import json, socket, subprocess, sys, time
    from flexgraph.cli.watch_folder import WatchFolder
    from flexgraph.cli.watchdog import Watchdog
    from flexgraph.training.config import WatchPolicy

    folder_path, error_kind, peer_lives = sys.argv[1], sys.argv[2], float(sys.argv[3])
    folder = WatchFolder(folder_path).make()
    peer = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({peer_lives})"])
    folder.beat_path(1).write_text(json.dumps({
        "rank": 1, "pid": peer.pid, "host": socket.gethostname(), "done": False,
        "step": "train", "iteration": 5}))
    dog = Watchdog(WatchPolicy(stall_timeout=60), folder, rank=0, world_size=2)
    error = (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                          "[127.0.0.1]:14251: Connection reset by peer")
             if error_kind == "transport" else ValueError("a bug of its own"))
    start = time.time()
    try:
        dog.failed(error)
        print(f"own failure recorded after {time.time() - start:.2f} s", flush=True)
    finally:
        peer.kill()
    """)


@pytest.mark.parametrize("error_kind, peer_lives, own", [
    ("transport", 0.5, False),  # the peer's sockets closed before its process was gone
    ("transport", 30.0, True),  # a peer that lives on: the error is this rank's own
    ("other", 0.5, True),  # not a collective's error: no look for a cause
])
def test_a_transport_error_waits_briefly_for_the_peer_that_caused_it(tmp_path, error_kind,
                                                                     peer_lives, own):
    """A killed rank closes its sockets before its process is gone: the other rank's
    collective may fail first. It then names the killed rank, not gloo's error (this raced
    under ``srun``); any other error, or a peer that stays, is reported as the rank's own."""
    from flexgraph.cli.watchdog import CAUSE_WAIT

    done = subprocess.run([sys.executable, "-c", _FAILING_RANK, str(tmp_path / "watch"),
                           error_kind, str(peer_lives)], capture_output=True, text=True,
                          timeout=60)
    if not own:
        assert done.returncode == 1, done.stderr[-3000:]
        assert done.stderr.splitlines() == [
            "error: rank 1 ended without reporting an error at iteration 5 (killed by a "
            "signal, or it exited on its own)"], done.stderr
        return
    assert done.returncode == 0, done.stderr[-3000:]
    waited = float(re.fullmatch(r"own failure recorded after (\S+) s\n", done.stdout)[1])
    if error_kind == "transport":
        assert CAUSE_WAIT <= waited < CAUSE_WAIT + 5, waited
    else:
        assert waited < CAUSE_WAIT / 2, waited
    assert "failed-rank0" in WatchFolder(tmp_path / "watch").events()


@pytest.mark.slow
def test_a_single_process_blocked_in_a_hook_is_stopped_with_its_stack(tmp_path):
    """One process, no launcher: its watchdog says the line itself and ends it (exit 3).

    The hook blocks after the second iteration: the first one gets the long phases'
    allowance, the second the bound."""
    script = tmp_path / "one.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.argv = ["flexgraph", "run", {str(_blocked_config(tmp_path))!r}, "--work-dir",
                    {str(tmp_path / "work")!r}, "--cfg-options", "env_cfg.stall_timeout=3"]
        from flexgraph.cli.main import run_and_exit
        run_and_exit()
        """))
    start = time.time()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == EXIT_STALLED, done.stderr[-3000:]
    [error] = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
    assert re.fullmatch(r"error: rank 0 made no progress for 3 s at iteration 2, in "
                        r"blocking\.py:\d+ after_train_iter \(stacks of every rank: "
                        r"\S+/stacks/\)", error), error
    assert time.time() - start < 100
    stacks = next((tmp_path / "work").glob("*/stacks/rank0.txt")).read_text()
    assert 'blocking.py", line ' in stacks and "in after_train_iter" in stacks


def _blocked_config(folder: Path) -> Path:
    (folder / "blocking.py").write_text(textwrap.dedent("""
        import time
        import torch
        from mmengine.hooks import Hook
        from mmengine.registry import DATASETS, HOOKS, MODELS


        @HOOKS.register_module(force=True)
        class BlockOnce(Hook):
            def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
                if runner.iter + 1 == 2:
                    time.sleep(3600)


        @MODELS.register_module(force=True)
        class Tiny(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(2, 1)

            def forward(self, x):
                return self.linear(x).pow(2).mean()


        @DATASETS.register_module(force=True)
        class Points(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return torch.ones(2) * i
        """))
    config = folder / "cfg.py"
    config.write_text(textwrap.dedent("""
        custom_imports = dict(imports=['blocking'], allow_failed_imports=False)
        model = dict(type='Tiny')
        train_dataloader = dict(dataset=dict(type='Points'), batch_size=2,
                                sampler=dict(type='DefaultSampler', shuffle=False))
        optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
        train_cfg = dict(by_epoch=True, max_epochs=1)
        default_hooks = dict(checkpoint=None)
        custom_hooks = [dict(type='BlockOnce')]
        """))
    return config


@pytest.fixture(autouse=True)
def _no_thread_left():
    before = set(threading.enumerate())
    yield
    assert not [t for t in threading.enumerate() if t not in before and t.is_alive()
                and t.name == "flexgraph-watchdog"]
