"""kill -9 at points a fixed seed chooses, during synchronous and background saves.

A portable checkpoint counts only once its manifest, written last, is in place
and the directory has its final name; a background save (``async_save``) is
put in place only when its write completed (at the next save, at the end, at
a stop). So wherever a run dies, ``--resume auto`` finds a complete
checkpoint (the last one in place, never a half-written one) and the resumed
run ends with the weights of a run never killed (one process: bit for bit).

The CI tier kills one background-saving run on one process; the longer tier
(``make test-matrix``) kills DDP runs on 2 processes at 10 points each, with
synchronous and with background saves (the points, drawn by a fixed seed, are
the same on every run).
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from tests.cli.cli_helpers import same_start
from tests.cli.portable_helpers import as_one_file, config, last_checkpoint, run

pytestmark = pytest.mark.slow

SEED = 17
SAVE_EVERY = 5
ITERS = 45  # one epoch on one process (batch 32)


def _kill_points(count: int, iters: int) -> list[int]:
    """Iterations after which a run is killed: a fixed seed, so CI never fails by chance."""
    return sorted(random.Random(SEED).sample(range(SAVE_EVERY + 1, iters - 1), count))


def _kill_and_resume(root, strategy, start, at_iter, *, async_save, epochs, reference):
    common = dict(epochs=epochs, interval=SAVE_EVERY, by_epoch=False, portable=True,
                  async_save=async_save)
    work = f"{'async' if async_save else 'sync'}-{at_iter}"
    run(config(root / f"kill-{work}", strategy, start, at_iter=at_iter, rank=0,
               everyone=True, **common), strategy, work, root, ok=False)
    leftovers = [p.name for p in (root / work).glob(".tmp-*")]
    out = run(config(root / f"resume-{work}", strategy, start, **common), strategy, work, root,
              "--resume", "auto")
    resumed = re.search(r"Resumed from \S+/iter_(\d+)\.ckpt", out)
    # the newest save before the kill (the hook kills before that iteration's own save)
    # is in place, unless its background write was still pending (put in place at the
    # next save): then the one before it, or none at all (the run starts from scratch)
    resumed_at = int(resumed.group(1)) if resumed else 0
    assert resumed or "starting from scratch" in out, out[-2000:]
    newest = (at_iter - 1) - (at_iter - 1) % SAVE_EVERY
    assert resumed_at in ((newest, newest - SAVE_EVERY) if async_save else (newest,)), \
        (at_iter, resumed_at, leftovers)
    assert_same(as_one_file(last_checkpoint(root / work)), reference)


def assert_same(resumed: dict, reference: dict) -> None:
    assert resumed["meta"]["iter"] == reference["meta"]["iter"]
    for key, value in reference["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key


def test_a_background_save_killed_anywhere_leaves_a_resumable_work_dir(tmp_path):
    start = same_start(tmp_path)
    run(config(tmp_path / "reference", "single", start, epochs=1, interval=SAVE_EVERY,
               by_epoch=False, portable=True), "single", "reference", tmp_path)
    reference = as_one_file(last_checkpoint(tmp_path / "reference"))
    for at_iter in _kill_points(1, ITERS):
        _kill_and_resume(tmp_path, "single", start, at_iter, async_save=True, epochs=1,
                         reference=reference)


@pytest.mark.matrix
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_ddp_killed_at_ten_seeded_points_always_resumes(tmp_path, async_save):
    start = same_start(tmp_path)
    run(config(tmp_path / "reference", "ddp", start, epochs=2, interval=SAVE_EVERY,
               by_epoch=False, portable=True), "ddp", "reference", tmp_path)
    reference = as_one_file(last_checkpoint(tmp_path / "reference"))
    for at_iter in _kill_points(10, 46):
        _kill_and_resume(tmp_path, "ddp", start, at_iter, async_save=async_save, epochs=2,
                         reference=reference)
