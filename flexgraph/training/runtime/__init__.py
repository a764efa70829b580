"""Where this process runs: its place in the run, its process group, its memory.

:class:`Env` (device, rank, world size, seed) is built once by the strategy's
``setup_env`` step; :func:`setup_process_group` joins torch.distributed. The RNG
helpers capture and restore this process's random streams; the meta-device
helpers build and materialize models whose weights do not exist yet.
"""

from flexgraph.training.runtime._distributed import leave_process_group, setup_process_group
from flexgraph.training.runtime._env import (
    DEFAULT_MMAP_THRESHOLD,
    Env,
    make_env,
    rank_seed,
    return_freed_memory,
    seed_everything,
)
from flexgraph.training.runtime._materialize import (
    materialize_module,
    meta_parameters,
    parameters_on_meta,
    uninitialised_parameters,
)
from flexgraph.training.runtime._rng import capture_rng, gather_rng_states, restore_rng

__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "Env",
    "capture_rng",
    "gather_rng_states",
    "leave_process_group",
    "make_env",
    "materialize_module",
    "meta_parameters",
    "parameters_on_meta",
    "rank_seed",
    "restore_rng",
    "return_freed_memory",
    "seed_everything",
    "setup_process_group",
    "uninitialised_parameters",
]
