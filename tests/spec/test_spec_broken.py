"""Broken specs, one per row: each fails with its own error class and names the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexgraph import FlexgraphError
from flexgraph.spec import load_spec
from tests.spec.broken_specs import CASES, Case, write_case


def test_the_table_is_big_and_covers_every_spec_error() -> None:
    import flexgraph.spec as spec

    assert len(CASES) >= 30
    raised = {case.error for case in CASES}
    errors = [getattr(spec, n) for n in spec.__all__ if n.endswith("Error") and n != "SpecError"]
    assert [e.__name__ for e in errors if e not in raised] == []


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_broken_spec_names_its_culprit(case: Case, tmp_path: Path) -> None:
    path = write_case(case, tmp_path)
    with pytest.raises(case.error) as info:
        load_spec(path).plan()
    error = info.value
    assert isinstance(error, FlexgraphError)
    message = str(error)
    assert case.target in message
    for fragment in case.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message.strip()
