"""Components for the quickstart: scikit-learn's digits, an MLP, an accuracy metric.

The quickstart must run anywhere in well under a minute, so it uses the 8x8
handwritten digits that ship inside scikit-learn (``load_digits``: 1797 images,
no download). The three classes are registered in MMEngine's registries, which
is how an MMEngine-style config (``examples/quickstart.py``) names them;
``force=True`` makes re-importing this module (tests, notebooks) harmless.

The model follows MMEngine's ``BaseModel`` contract: ``forward(..., mode='loss')``
returns a dict of losses, ``mode='predict'`` one prediction per sample for the
metric.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, METRICS, MODELS
from torch import nn

__all__ = ["DigitsAccuracy", "DigitsDataset", "DigitsMLP"]


@DATASETS.register_module(force=True)
class DigitsDataset(torch.utils.data.Dataset):
    """One split of the digits: pixels scaled to [0, 1], a fixed shuffled split.

    Parameters
    ----------
    split:
        ``'train'`` or ``'val'``; the split is a seeded permutation, so both
        splits are disjoint and identical in every process.
    val_fraction:
        Share of the 1797 images held out for validation.
    """

    def __init__(self, split: str = "train", val_fraction: float = 0.2, seed: int = 0) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        images, labels = _load_digits()
        order = np.random.default_rng(seed).permutation(len(images))
        n_val = int(len(images) * val_fraction)
        keep = order[n_val:] if split == "train" else order[:n_val]
        self.inputs = torch.tensor(images[keep] / 16.0, dtype=torch.float32)
        self.labels = torch.tensor(labels[keep], dtype=torch.long)
        self.metainfo = {"classes": tuple(str(d) for d in range(10))}

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.inputs[index], "labels": self.labels[index]}


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``load_digits(return_X_y=True)``, without importing scikit-learn.

    The file ``load_digits`` reads is read the same way here: importing
    scikit-learn (SciPy's statistics come with it) takes longer than training
    the quickstart, and every process of every run would pay it. Where a
    release keeps the file elsewhere, ``load_digits`` itself is used.
    """
    found = importlib.util.find_spec("sklearn")  # finds the package, runs none of it
    folders = found.submodule_search_locations if found else None
    path = Path(folders[0], "datasets", "data", "digits.csv.gz") if folders else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        return load_digits(return_X_y=True)
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def _stack(x: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """``pseudo_collate`` hands lists of samples; stack them into a batch."""
    return torch.stack(list(x)) if isinstance(x, (list, tuple)) else x


@MODELS.register_module(force=True)
class DigitsMLP(BaseModel):
    """64 -> hidden -> 10 MLP with dropout (dropout makes RNG state matter on resume)."""

    def __init__(self, hidden: int = 128, dropout: float = 0.1,
                 data_preprocessor: dict | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, 10))

    def forward(self, inputs, labels=None, mode: str = "tensor"):
        logits = self.net(_stack(inputs))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, _stack(labels))}
        if mode == "predict":
            preds = logits.argmax(dim=1).tolist()
            return [{"pred": p, "label": int(t)} for p, t in zip(preds, _stack(labels).tolist(),
                                                                 strict=True)]
        return logits


@METRICS.register_module(force=True)
class DigitsAccuracy(BaseMetric):
    """Share of samples whose predicted digit is the label, as ``accuracy/top1``."""

    default_prefix = "accuracy"

    def process(self, data_batch, data_samples) -> None:
        self.results.extend(int(s["pred"] == s["label"]) for s in data_samples)

    def compute_metrics(self, results: list) -> dict[str, float]:
        return {"top1": sum(results) / len(results)}
