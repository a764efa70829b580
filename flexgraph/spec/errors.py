"""Every way a spec file can be wrong, one class per failure.

Messages start with the file, then the place (``steps[2] (tokenize)``), then the field.
"""

from __future__ import annotations

from flexgraph.core.errors import FlexgraphError


class SpecError(FlexgraphError):
    """Base class of the errors in a spec file."""


class SpecNotFoundError(SpecError, FileNotFoundError):
    """The spec file does not exist."""


class SpecFormatError(SpecError, ValueError):
    """The file's suffix is none of .yaml, .yml, .py."""


class SpecSyntaxError(SpecError, SyntaxError):
    """The file does not parse (YAML or Python); the message names the line."""


class SpecFieldError(SpecError, ValueError):
    """A mapping has a key the schema does not know (the message suggests close ones)."""


class SpecMissingFieldError(SpecError, ValueError):
    """A mapping lacks a key the schema requires."""


class SpecTypeError(SpecError, TypeError):
    """A field holds a value of the wrong type (a number where names belong, ...)."""


class SpecValueError(SpecError, ValueError):
    """A field has the right type but a bad value (``fn: tokenize`` without a module)."""


class SpecScriptError(SpecError, RuntimeError):
    """Running a Python spec or a cfg.py raised; the cause is chained."""


class SpecPipelineError(SpecError, TypeError):
    """A Python spec's ``pipeline`` is not a Graph, a Spec or a callable giving one."""


class SpecImportError(SpecError, ImportError):
    """A config's ``custom_imports`` could not be imported."""


class SpecConfigError(SpecError, ValueError):
    """MMEngine refused the config (a missing ``_base_``, a bad ``--cfg-options``)."""


class SpecNoGraphError(SpecError, ValueError):
    """A cfg.py has no ``steps`` and no default graph was given to fall back on."""


def restate(exc: FlexgraphError, prefix: str) -> FlexgraphError:
    """``exc`` as the same class with ``prefix: `` in front, so ``except`` clauses still match."""
    try:
        return type(exc)(f"{prefix}: {exc}")
    except TypeError:  # a subclass with a different constructor: keep it as is
        return exc
