"""Pipeline specs: YAML files, Python-API scripts and MMEngine-style cfg.py configs.

All three load (:func:`load_spec`) into one :class:`Spec`: a graph, the
strategies it defines as data, its strategy choice and its inputs. This layer
never imports torch, the training layer, the strategies or the CLI.
"""

from flexgraph.spec.errors import (
    SpecConfigError,
    SpecError,
    SpecFieldError,
    SpecFormatError,
    SpecImportError,
    SpecMissingFieldError,
    SpecNoGraphError,
    SpecNotFoundError,
    SpecPipelineError,
    SpecScriptError,
    SpecSyntaxError,
    SpecTypeError,
    SpecValueError,
)
from flexgraph.spec.load import load_spec
from flexgraph.spec.model import Spec
from flexgraph.spec.rewrites import rewrite_from_mapping, strategy_from_data
from flexgraph.spec.steps import STEP_FIELDS, step_from_mapping

__all__ = [
    "STEP_FIELDS",
    "Spec",
    "SpecConfigError",
    "SpecError",
    "SpecFieldError",
    "SpecFormatError",
    "SpecImportError",
    "SpecMissingFieldError",
    "SpecNoGraphError",
    "SpecNotFoundError",
    "SpecPipelineError",
    "SpecScriptError",
    "SpecSyntaxError",
    "SpecTypeError",
    "SpecValueError",
    "load_spec",
    "rewrite_from_mapping",
    "step_from_mapping",
    "strategy_from_data",
]
