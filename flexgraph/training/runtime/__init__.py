"""Where this process runs: its place in the run, its process group, its memory.

:class:`Env` (device, rank, world size, seed) is built once by the strategy's
``setup_env`` step; :func:`setup_process_group` joins torch.distributed. The RNG
helpers capture and restore this process's random streams, and record the
draws one rank makes so that another can make them again; the meta-device
helpers build models whose weights do not exist yet; the process-group helpers
answer rank, world size and "is a group up" for code that has no Env, let rank
0 act for every rank, and let the ranks agree on a failure.
"""

from flexgraph.training.runtime._distributed import leave_process_group, setup_process_group
from flexgraph.training.runtime._draws import (
    Draw,
    SourceDraws,
    drawn_by,
    follow_source_draws,
    host_generators_moved,
    parameters_without_values,
    recording_draws,
    replay_draws,
)
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
    group_is_up,
    launch_rank,
    launch_world_size,
    rank0_does,
    this_rank,
    world_size,
)
from flexgraph.training.runtime._materialize import meta_parameters, parameters_on_meta
from flexgraph.training.runtime._rng import (
    capture_rng,
    gather_rng_states,
    restore_rng,
)

__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "Draw",
    "Env",
    "SourceDraws",
    "agreed",
    "barrier",
    "broadcast_buffers",
    "broadcast_from_rank0",
    "capture_rng",
    "drawn_by",
    "first_error_of_all_ranks",
    "follow_source_draws",
    "gather_rng_states",
    "gathered_from_every_rank",
    "group_is_up",
    "host_generators_moved",
    "launch_rank",
    "launch_world_size",
    "leave_process_group",
    "make_env",
    "meta_parameters",
    "parameters_without_values",
    "parameters_on_meta",
    "rank0_does",
    "rank_seed",
    "recording_draws",
    "replay_draws",
    "restore_rng",
    "return_freed_memory",
    "seed_everything",
    "setup_process_group",
    "this_rank",
    "use_default_scope",
    "world_size",
]
