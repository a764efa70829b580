"""Pipeline specs: YAML files, Python-API scripts and MMEngine-style cfg.py configs.

All three load (:func:`load_spec`) into one :class:`Spec`. This layer never
imports torch, the training layer, the strategies or the CLI.
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

__all__ = [
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
]
