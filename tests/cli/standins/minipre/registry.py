"""The scope's registries: children of MMEngine's, filled on first use from ``locations``.

Every registry MMEngine's root has gets a child here, as mmpretrain's
``registry.py`` does, so that builds in this scope never fall back (with a
warning) to the root.
"""

from mmengine import registry as root
from mmengine.registry import Registry

_LOCATIONS = {
    "MODELS": ["minipre.models"], "DATASETS": ["minipre.datasets"],
    "TRANSFORMS": ["minipre.datasets"], "METRICS": ["minipre.metrics"],
    "HOOKS": ["minipre.hooks"], "OPTIM_WRAPPER_CONSTRUCTORS": ["minipre.optim"],
}
_CHILDREN = ("RUNNERS", "RUNNER_CONSTRUCTORS", "LOOPS", "HOOKS", "STRATEGIES", "DATASETS",
             "DATA_SAMPLERS", "TRANSFORMS", "MODELS", "MODEL_WRAPPERS", "WEIGHT_INITIALIZERS",
             "OPTIMIZERS", "OPTIM_WRAPPERS", "OPTIM_WRAPPER_CONSTRUCTORS", "PARAM_SCHEDULERS",
             "METRICS", "EVALUATOR", "TASK_UTILS", "VISUALIZERS", "VISBACKENDS",
             "LOG_PROCESSORS", "INFERENCERS", "FUNCTIONS")

for _name in _CHILDREN:
    _parent = getattr(root, _name)
    globals()[_name] = Registry(_parent.name, parent=_parent,
                                locations=_LOCATIONS.get(_name, []))
