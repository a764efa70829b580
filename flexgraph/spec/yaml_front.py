"""YAML pipeline specs: the steps and strategies of a pipeline as plain data.

Schema (every mapping is closed: an unknown key is an error with a did-you-mean)::

    steps:                      # required, declared together (list order chains updaters)
      - name: tokenize          # required
        fn: textstats:tokenize  # required, "module:attr", imported only when run
        requires: text          # requires / provides / updates / after / before:
        provides: [tokens]      #   a name or a list of names
        params: {lower: true}   # keyword arguments bound to fn
        doc: split into words
    strategies:                 # name -> list of rewrites, or {doc:, rewrites:}
      lowercase_first:
        - {move: lowercase, before: drop_stopwords}
    strategy: lowercase_first   # a name or {type: name, **options}
    inputs: {document: "..."}   # initial artifacts; their names become graph inputs
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from flexgraph.spec.checks import Where, check_keys, mapping
from flexgraph.spec.errors import SpecMissingFieldError, SpecSyntaxError
from flexgraph.spec.model import Spec
from flexgraph.spec.steps import graph_of, steps_from_list
from flexgraph.spec.toplevel import apply_options, build_spec, inputs_from_data

TOP_LEVEL = ("steps", "strategies", "strategy", "inputs")


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping
)


def read_yaml(path: Path, shown: str) -> object:
    """Parse ``path`` safely; a syntax error names ``shown`` (the file) and the line."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecSyntaxError(f"{shown}{line}: YAML syntax error: {problem}") from exc
    except UnicodeDecodeError as exc:
        raise SpecSyntaxError(f"{shown}: not UTF-8 text ({exc.reason})") from exc


def load_yaml_spec(path: Path, shown: str, cfg_options: dict[str, Any] | None = None) -> Spec:
    """Load a YAML spec; ``cfg_options`` override entries of its ``inputs``."""
    where = Where(shown)
    data = read_yaml(path, shown)
    if data is None:
        raise SpecMissingFieldError(f"{shown}: the file is empty; a spec needs at least 'steps'")
    data = mapping(data, where)
    check_keys(data, where, TOP_LEVEL, required=("steps",), what="top-level key")
    declared = inputs_from_data(data.get("inputs"), where)
    graph = graph_of(steps_from_list(data["steps"], where, "steps"), list(declared), where)
    return build_spec(data, graph, where, apply_options(declared, cfg_options))
