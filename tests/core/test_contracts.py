"""Contracts: checks the executor runs before and after a step, stopping the run by name."""

from __future__ import annotations

import pytest

from flexgraph import ContractError, Executor, Graph, Step, StepFunctionError, make_plan

HERE = __name__
seen: list[str] = []


def double(x):
    return 2 * x


def at_most_ten(y):
    seen.append(f"after {y}")
    return None if y <= 10 else f"y is {y}, over 10; fix: give a smaller x"


def positive(x, params):
    seen.append(f"before {x} {dict(params)}")
    return None if x > 0 else "x is not positive"


def plan(**checks):
    step = Step("double", f"{HERE}:double", requires="x", provides="y", params={}, **checks)
    return make_plan(Graph.of([step], inputs=["x"]))


def test_a_contract_runs_after_its_step_and_before_it_on_what_it_receives():
    seen.clear()
    checked = plan(contracts=f"{HERE}:at_most_ten", expects=f"{HERE}:positive")
    assert Executor().run(checked, {"x": 3}).context["y"] == 6
    assert seen == ["before 3 {}", "after 6"]


def test_a_broken_contract_stops_the_run_in_one_line_naming_step_contract_and_fix():
    with pytest.raises(ContractError) as info:
        Executor().run(plan(contracts=f"{HERE}:at_most_ten"), {"x": 7})
    assert str(info.value) == ("step 'double' broke contract 'at_most_ten' after it ran: "
                               "y is 14, over 10; fix: give a smaller x")
    assert (info.value.step, info.value.contract) == ("double", "at_most_ten")
    with pytest.raises(ContractError, match="'positive' before it ran: x is not positive"):
        Executor().run(plan(expects=f"{HERE}:positive"), {"x": -1})


def test_a_misspelt_contract_fails_before_any_step_runs():
    seen.clear()
    with pytest.raises(StepFunctionError):
        Executor().run(plan(contracts=f"{HERE}:no_such_check", expects=f"{HERE}:positive"),
                       {"x": 1})
    assert seen == []
