"""The run's components, built from the config as MMEngine builds them."""

from flexgraph.training.components._data import (
    build_dataloader,
    build_dataloaders,
    epoch_batches,
    epoch_length_of,
    per_rank_batch,
    set_per_rank_batch,
)
from flexgraph.training.components._model import build_model_from_cfg
from flexgraph.training.components._model_api import (
    forward,
    loss_of,
    make_eval_step,
    make_train_step,
    unwrap_model,
    uses_step_api,
)
from flexgraph.training.components._optim import (
    build_optim_wrapper,
    build_param_schedulers,
    first_param_group,
)
from flexgraph.training.components._weight_init import initialise, record_one_device_setup

__all__ = [
    "per_rank_batch",
    "set_per_rank_batch",
    "build_dataloader",
    "build_dataloaders",
    "build_model_from_cfg",
    "build_optim_wrapper",
    "build_param_schedulers",
    "epoch_batches",
    "epoch_length_of",
    "first_param_group",
    "forward",
    "initialise",
    "loss_of",
    "make_eval_step",
    "make_train_step",
    "record_one_device_setup",
    "unwrap_model",
    "uses_step_api",
]
