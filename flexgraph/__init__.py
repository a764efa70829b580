"""flexgraph: training setup as a graph of named steps that strategies rewrite.

The public face. Importing flexgraph never imports torch.
"""

from flexgraph.core.checks import PlanCheckError, Precedes
from flexgraph.core.errors import FlexgraphError
from flexgraph.core.executor import (
    ContractError,
    Executor,
    RunResult,
    StepFailedError,
    StepRecord,
)
from flexgraph.core.graph import (
    AmbiguousOrderError,
    CycleError,
    DuplicateProducerError,
    DuplicateStepError,
    Edge,
    Graph,
    MissingInputError,
    UnknownStepError,
)
from flexgraph.core.plan import Origin, Plan, make_plan
from flexgraph.core.rewrite import (
    Configure,
    Fuse,
    IfAbsent,
    IfPresent,
    Insert,
    Move,
    Prune,
    Remove,
    Replace,
    Rewrite,
    RewriteDefinitionError,
)
from flexgraph.core.states import PlacementError
from flexgraph.core.step import (
    Step,
    StepDefinitionError,
    StepFunctionError,
    StepOutputError,
    step,
)
from flexgraph.core.strategy import (
    Strategy,
    StrategyOptionError,
    UnknownStrategyError,
    get_strategy,
    register_strategy,
)

__version__ = "0.1.0"

__all__ = [
    "AmbiguousOrderError",
    "Configure",
    "ContractError",
    "CycleError",
    "DuplicateProducerError",
    "DuplicateStepError",
    "Edge",
    "Executor",
    "FlexgraphError",
    "Fuse",
    "Graph",
    "IfAbsent",
    "IfPresent",
    "Insert",
    "MissingInputError",
    "Move",
    "Origin",
    "PlacementError",
    "Plan",
    "PlanCheckError",
    "Precedes",
    "Prune",
    "Remove",
    "Replace",
    "Rewrite",
    "RewriteDefinitionError",
    "RunResult",
    "Step",
    "StepDefinitionError",
    "StepFailedError",
    "StepFunctionError",
    "StepOutputError",
    "StepRecord",
    "Strategy",
    "StrategyOptionError",
    "UnknownStepError",
    "UnknownStrategyError",
    "get_strategy",
    "make_plan",
    "register_strategy",
    "step",
]
