"""The quickstart example trains to the accuracy its docstring promises."""

from __future__ import annotations

import json

from mmengine.config import Config

from tests.training.training_helpers import EXAMPLES, run_steps


def test_quickstart_reaches_stated_accuracy(tmp_path):
    cfg = Config.fromfile(str(EXAMPLES / "quickstart.py"))
    cfg.work_dir = str(tmp_path / "quickstart")
    ctx = run_steps(cfg)
    result = ctx["train_result"]
    assert result["iter"] == 900 and result["epoch"] == 20
    assert result["val/accuracy/top1"] >= 0.95

    work = tmp_path / "quickstart"
    lines = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if "mode" not in r]
    assert [r["iter"] for r in train] == list(range(1, 901))
    assert {"iter", "epoch", "loss", "lr"} <= set(train[0])
    val = [r for r in lines if r.get("mode") == "val"]
    assert [r["epoch"] for r in val] == [5, 10, 15, 20]
    # interval=10 epochs, max_keep_ckpts=2; the pointer names the last one
    assert sorted(p.name for p in work.glob("*.pth")) == ["epoch_10.pth", "epoch_20.pth"]
    assert (work / "last_checkpoint").read_text().endswith("epoch_20.pth")
    # its TensorboardVisBackend writes in runner.log_dir (work_dir: run_steps opens no record)
    assert any((work / "vis_data").glob("events.out.tfevents.*"))


def test_quickstart_checkpoint_evaluates_the_same_through_the_val_entry_point(tmp_path):
    cfg = Config.fromfile(str(EXAMPLES / "quickstart.py"))
    cfg.work_dir = str(tmp_path / "q")
    cfg.train_cfg.max_epochs = 2
    cfg.train_cfg.val_interval = 1
    trained = run_steps(cfg)["train_result"]
    cfg.load_from = str(tmp_path / "q" / "epoch_2.pth")
    assert run_steps(cfg, last="val")["val_result"] == {
        "accuracy/top1": trained["val/accuracy/top1"]}
    cfg.val_evaluator = None  # a BaseModel without an evaluator reports its mean loss
    assert set(run_steps(cfg, last="val")["val_result"]) == {"loss"}


def test_the_quickstart_reads_exactly_scikit_learns_digits():
    """examples/digits.py reads load_digits's own file (scikit-learn's import costs seconds)."""
    import numpy as np
    from digits import _load_digits
    from sklearn.datasets import load_digits

    (images, labels), (expected_images, expected_labels) = _load_digits(), load_digits(
        return_X_y=True)
    assert images.dtype == expected_images.dtype and labels.dtype == expected_labels.dtype
    assert np.array_equal(images, expected_images) and np.array_equal(labels, expected_labels)
