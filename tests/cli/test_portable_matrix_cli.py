"""Every strategy resumes every strategy's checkpoint: the full 6 x 6 matrix (longer tier).

Deselected by default (marker ``matrix``); ``make test-matrix`` runs it (about
6 minutes on 2 cores: 6 writers and 36 readers, 2 processes each but single).
Each writer trains one epoch from one fixed initial state in its default
checkpoint format; each reader resumes that work_dir with ``--resume auto``
for a second epoch (23 optimizer steps). The global batch is 64 everywhere
(single device takes 64 per batch, the others 32 on each of 2 processes), so
every pair must end where one uninterrupted DDP run of two epochs ends: weights
and Adam moments to 1e-5 relative.
"""

from __future__ import annotations

import shutil

import pytest

from tests.cli.cli_helpers import same_start
from tests.cli.portable_helpers import (
    STRATEGIES,
    as_one_file,
    assert_same_weights,
    config,
    last_checkpoint,
    run,
)

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.matrix]

NAMES = ("single", "ddp", "fsdp", "zero1", "zero2", "zero3")
assert set(NAMES) <= set(STRATEGIES)


def _batch(strategy: str) -> int | None:
    return 64 if strategy == "single" else None


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One epoch under each strategy, and the uninterrupted two-epoch DDP reference."""
    root = tmp_path_factory.mktemp("matrix")
    start = same_start(root)
    for writer in NAMES:
        run(config(root / f"write-{writer}", writer, start, epochs=1, batch=_batch(writer)),
            writer, f"by-{writer}", root)
    run(config(root / "reference", "ddp", start, epochs=2), "ddp", "reference", root)
    return {"root": root, "start": start,
            "reference": as_one_file(last_checkpoint(root / "reference"))}


@pytest.mark.parametrize("reader", NAMES)
@pytest.mark.parametrize("writer", NAMES)
def test_every_strategy_resumes_every_strategys_checkpoint(written, writer, reader):
    root = written["root"]
    work = f"{writer}-then-{reader}"
    shutil.copytree(root / f"by-{writer}", root / work)
    out = run(config(root / f"read-{work}", reader, written["start"], epochs=2,
                     batch=_batch(reader)), reader, work, root, "--resume", "auto")
    assert "Resumed from" in out and "epoch 1, iter 23" in out, out[-3000:]
    assert_same_weights(as_one_file(last_checkpoint(root / work)), written["reference"])
