"""flexgraph's training runtime: the standard graph, its steps, and what they run on.

An MMEngine-style config becomes a trained model through plain step functions
(:mod:`flexgraph.training.steps`) wired by :func:`standard_graph`. It uses MMEngine's
components but not its Runner, so that the order of setup is the graph's. Each concern
below the steps is a subpackage with a short face; they import each other only downward.

Checkpoint words: a run *saves* its checkpoints and *restores* one to continue
(``resume``); it *loads* weights into a model (``load_from``). A *restorer* restores a run
from a format, an *opener* reads any format one tensor at a time, and an *inspector*
describes one offline (``flexgraph ckpt inspect``).
"""

from flexgraph.training.graph import standard_graph, standard_inputs

__all__ = ["standard_graph", "standard_inputs"]
