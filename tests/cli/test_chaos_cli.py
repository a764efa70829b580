"""Chaos: signals, kills and damaged files against ``flexgraph run --nproc-per-node 2`` (gloo).

One module-scoped chain of runs serves most specifications, since each
launch costs seconds of process start-up. A DDP run is interrupted again and
again at iterations a seeded RNG picks (printed, so a failure can be
replayed): by SIGTERM, SIGINT (with a second SIGINT while the checkpoint is
written) and SIGUSR1 sent to the launcher, by SIGTERM sent to one rank only
(under ``--max-restarts 1``, which must not restart a stopped run), and once
by SIGKILL of the whole run in the middle of a save. Each time the same
command with ``--resume auto`` continues; before the last one, damaged
checkpoints are planted in the work_dir. The chain must end with exactly the
weights, optimizer state and per-iteration losses of a run never interrupted.
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.cli.cli_helpers import (
    ROOT,
    assert_same_training_state,
    final_state,
    flexgraph_run,
    train_losses,
    write_config,
)

pytestmark = pytest.mark.slow

sys.path.insert(0, str(ROOT))

EXIT_STOPPED = 75
CHECK = 4  # preemption.check_interval: two ranks agree on a stop every 4 iterations
ITERS = 69  # 3 epochs x 23 iterations per rank
SEED = 20240611

CHAIN = f"""
train_dataloader = dict(num_workers=1)  # its worker must outlive the signal, too
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', interval=20, by_epoch=False, max_keep_ckpts=3),
    logger=dict(type='LoggerHook', interval=1))
preemption = dict(check_interval={CHECK})
"""
LAUNCH = ("--nproc-per-node", "2")


def _saved_iter(work_dir: Path) -> int:
    return final_state(work_dir)["meta"]["iter"]


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("chaos")
    rng = random.Random(SEED)
    plain = write_config(root / "plain", extra=CHAIN, at_iter=-1)
    reference = flexgraph_run(str(plain), "--work-dir", "reference", *LAUNCH, cwd=root)
    assert reference.returncode == 0, reference.stderr[-3000:]

    trials = [  # (signal, sent to, second signal during the save, extra flags)
        ("SIGTERM", "launcher", False, ()),
        ("SIGTERM", "self", False, ("--max-restarts", "1")),  # a stop is not restarted
        ("SIGINT", "launcher", True, ()),
        ("kill", None, False, ()),
        ("SIGUSR1", "launcher", False, ("--preempt-signal", "USR1")),
        ("SIGTERM", "launcher", False, ()),
    ]
    work, done, stops = root / "chain", 0, []
    for n, (sig, to, again, flags) in enumerate(trials):
        resume = ("--resume", "auto") if n else ()
        if sig == "kill":  # SIGKILL of launcher and ranks halfway through the next save
            config = write_config(root / f"trial{n}", extra=CHAIN, during_save=1,
                                  everyone=True)
            run = flexgraph_run(str(config), "--work-dir", "chain", *LAUNCH, *resume, cwd=root)
            stops.append({"kill": run, "before": done, "listing": sorted(
                p.name for p in work.iterdir())})
            continue
        at = done + rng.randint(1, 2 * CHECK)  # iterations done when the signal is sent
        print(f"trial {n}: {sig} to {to} after iteration {at} (resumed at {done})")
        hook = f"dict(type='SignalAt', at_iter={at}, sig={sig!r}, to={to!r}, rank=1, " \
               f"again={again})"
        config = write_config(root / f"trial{n}", extra=CHAIN + f"custom_hooks = [{hook}]\n")
        run = flexgraph_run(str(config), "--work-dir", "chain", *LAUNCH, *resume, *flags,
                            cwd=root)
        saved = final_state(work)  # before a later save prunes it
        done = saved["meta"]["iter"]
        stops.append({"run": run, "at": at, "stopped": done, "sig": sig, "to": to,
                      "again": again, "ranks_saved": len(saved["rng_states"])})
        assert run.returncode == EXIT_STOPPED, run.stderr[-3000:]
        assert done < ITERS - CHECK

    # Damage planted before the last resume: a newer checkpoint that the pointer names
    # but whose bytes changed on disk, and a newest one that is empty.
    good = Path((work / "last_checkpoint").read_text().strip())
    sample = shutil.copy(good, root / "sample.pth")  # a real checkpoint, for damaging later
    corrupt, empty = work / f"iter_{done + 1}.pth", work / f"iter_{done + 2}.pth"
    shutil.copy(good, corrupt)
    _flip_a_byte(corrupt)
    (work / "last_checkpoint").write_text(str(corrupt.resolve()))
    time.sleep(0.01)
    empty.write_bytes(b"")
    last = flexgraph_run(str(plain), "--work-dir", "chain", *LAUNCH, "--resume", "auto",
                         cwd=root)
    assert last.returncode == 0, last.stderr[-3000:]
    return {"root": root, "stops": stops, "last": last, "good": good, "corrupt": corrupt,
            "empty": empty, "sample": Path(sample)}


def test_every_signal_stops_all_ranks_at_one_iteration_and_saves_there(chain):
    for stop in (s for s in chain["stops"] if "run" in s):
        run, at, saved = stop["run"], stop["at"], stop["stopped"]
        assert saved == -(-at // CHECK) * CHECK, stop  # the ranks' first agreement after it
        message = f"stopped by {stop['sig']} after iteration {saved} of {ITERS}"
        assert run.stderr.count(message) == 1, run.stderr[-3000:]  # said once, by the launcher
        assert "restarting the group" not in run.stderr
        assert "--resume auto" in run.stderr and "Traceback" not in run.stderr
        assert stop["ranks_saved"] == 2, "every rank's RNG state is in the checkpoint"


def test_a_second_signal_during_the_save_is_reported_and_the_save_completes(chain):
    [stop] = [s for s in chain["stops"] if s.get("again")]
    assert "SIGINT again: already stopping" in stop["run"].stderr
    assert stop["run"].returncode == EXIT_STOPPED


def test_sigkill_of_the_whole_run_during_a_save_resumes_from_the_previous_checkpoint(chain):
    [kill] = [s for s in chain["stops"] if "kill" in s]
    assert kill["kill"].returncode == -signal.SIGKILL
    assert any(name.startswith(".tmp-iter_") for name in kill["listing"]), kill["listing"]
    following = chain["stops"][chain["stops"].index(kill) + 1]["run"]
    out = following.stdout + following.stderr
    assert "Resumed from" in out and f"/iter_{kill['before']}.pth: epoch" in out


def test_resume_auto_skips_damaged_checkpoints_with_a_warning_naming_them(chain):
    out = chain["last"].stdout + chain["last"].stderr
    assert f"skipping {chain['corrupt'].name}: checkpoint" in out
    assert "fails the CRC-32 check" in out
    assert f"skipping {chain['empty'].name}: checkpoint" in out and "is empty" in out
    assert "Resumed from" in out and f"/{chain['good'].name}: epoch" in out


def test_the_interrupted_chain_ends_bit_identical_to_an_uninterrupted_run(chain):
    root = chain["root"]
    assert _saved_iter(root / "chain") == ITERS
    assert_same_training_state(final_state(root / "reference"), final_state(root / "chain"))
    assert train_losses(root / "chain") == train_losses(root / "reference")


def test_a_damaged_checkpoint_given_to_resume_is_one_line_on_every_rank(chain, tmp_path):
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(chain["sample"].read_bytes()[:3000])
    config = write_config(tmp_path / "cfg")
    done = flexgraph_run(str(config), "--work-dir", "w", "--resume", str(truncated), *LAUNCH,
                         cwd=tmp_path)
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.startswith("error: step 'resume'")]
    assert 1 <= len(lines) <= 2, done.stderr[-3000:]  # once per rank, or once in all
    assert all(f"checkpoint '{truncated}' is truncated" in x for x in lines)
    assert "Traceback" not in done.stderr


# -- one process ----------------------------------------------------------------------------

def _broken_pickle(good: Path, path: Path) -> None:
    """``good`` with data.pkl replaced by a pickle that underflows the unpickler's stack."""
    import zipfile

    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = b"\x80\x02t."  # TUPLE without a MARK: pop from an empty list
            dst.writestr(info.filename, data)


def test_bad_checkpoints_in_a_single_process_run_are_one_line_and_exit_2(chain, tmp_path):
    broken = tmp_path / "broken.pth"
    _broken_pickle(chain["sample"], broken)
    foreign = tmp_path / "weights.pth"
    foreign.write_text('{"weights": [1, 2, 3]}')
    config = write_config(tmp_path / "cfg")
    for flag, path, what in (("--resume", broken, "is corrupt: torch.load fails with "
                              "IndexError: pop from empty list"),
                             ("--load-from", foreign, "is not a torch checkpoint: it looks "
                              "like a text file")):
        done = flexgraph_run(str(config), "--work-dir", "w", flag, str(path), cwd=tmp_path)
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"checkpoint '{path}' {what}" in done.stderr
    assert not (tmp_path / "w" / "last_checkpoint").exists()
