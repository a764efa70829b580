"""The tiny workload behind MMEngine's ``BaseModel`` contract, and its hand-written script.

The same MLP, data and optimizer as ``_tiny.py``, but the model is an MMEngine
``BaseModel`` (data preprocessor, ``train_step``) and the optimizer sits in an
``OptimWrapper``: what an MMEngine user's model looks like. This module
imports torch, ``mmengine.model`` and ``mmengine.optim`` (what such a model
needs) and nothing else; registering the model is left to whoever configures it.

Run as a script, it is the hand-written training script of such a model that
``startup.py`` times: it builds the model, the data and the optimizer wrapper,
trains one iteration through ``model.train_step``, prints
``first-iteration <time.time()>`` and exits at once::

    python benchmarks/_tiny_mm.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _tiny import BATCH, TinyData, mlp, stamp
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper


class TinyBaseModel(BaseModel):
    """The MLP as a BaseModel: ``forward(x, y, mode)``, a loss dict in ``'loss'`` mode."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x, y, mode="tensor"):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


def main(iters: int = 1000) -> None:
    """The hand-written script: what ``flexgraph run`` of that config does, by hand."""
    torch.manual_seed(0)
    model = TinyBaseModel()
    optim_wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    loader = torch.utils.data.DataLoader(TinyData(iters * BATCH), batch_size=BATCH,
                                         shuffle=True)
    for batch in loader:
        log_vars = model.train_step(batch, optim_wrapper)
        log_vars["loss"].item()  # the value a real script logs (and the wait for it)
        stamp()


if __name__ == "__main__":
    main()
