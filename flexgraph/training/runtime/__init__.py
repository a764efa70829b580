"""Where this process runs: its place in the run, its process group, its RNGs, its memory."""

from flexgraph.training.runtime._distributed import leave_process_group, setup_process_group
from flexgraph.training.runtime._draws import follow_source_draws
from flexgraph.training.runtime._env import (
    DEFAULT_MMAP_THRESHOLD,
    Env,
    make_env,
    rank_seed,
    return_freed_memory,
    seed_everything,
    use_default_scope,
)
from flexgraph.training.runtime._group import (
    agreed,
    barrier,
    broadcast_buffers,
    broadcast_from_rank0,
    first_error_of_all_ranks,
    gathered_from_every_rank,
    launch_rank,
    launch_world_size,
    rank0_does,
    this_rank,
    world_size,
)
from flexgraph.training.runtime._materialize import meta_parameters, parameters_on_meta
from flexgraph.training.runtime._replay import ReplayError, SetupRecord, record_setup
from flexgraph.training.runtime._rng import (
    capture_rng,
    gather_rng_states,
    restore_rng,
)

__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "Env",
    "ReplayError",
    "SetupRecord",
    "agreed",
    "barrier",
    "broadcast_buffers",
    "broadcast_from_rank0",
    "capture_rng",
    "first_error_of_all_ranks",
    "follow_source_draws",
    "gather_rng_states",
    "gathered_from_every_rank",
    "launch_rank",
    "launch_world_size",
    "leave_process_group",
    "make_env",
    "meta_parameters",
    "parameters_on_meta",
    "rank0_does",
    "rank_seed",
    "record_setup",
    "restore_rng",
    "return_freed_memory",
    "seed_everything",
    "setup_process_group",
    "this_rank",
    "use_default_scope",
    "world_size",
]
