"""The training layer: standard steps, the loop, hooks, checkpoints."""
