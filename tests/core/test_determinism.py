"""Determinism: one graph and strategy give one plan, in any process, under any hash seed.

Sets and dicts of names are everywhere in the engine; a plan that depended on
their iteration order would change between runs. Twenty fresh interpreters
with different ``PYTHONHASHSEED`` values must print the very same plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexgraph import Configure, Fuse, Graph, Insert, Move, Remove, Replace, Strategy, make_plan
from tests.core.engine_helpers import mk, training_like

ROOT = Path(__file__).resolve().parents[2]


def wide_graph() -> Graph:
    """Many independent steps and artifacts, so that ties are everywhere."""
    steps = [mk(f"make_{i}", provides=f"art_{i}") for i in range(12)]
    steps += [mk(f"tweak_{i}", updates=f"art_{i % 4}") for i in range(8)]
    steps += [mk(f"use_{i}", requires=(f"art_{i}", f"art_{(i + 5) % 12}")) for i in range(12)]
    return training_like() | Graph.of(steps)


STRATEGY = Strategy(
    "mixed",
    [
        Insert(mk("shard", updates="model"), after="build_model"),
        Move("init_weights", after="shard"),
        Move("tweak_5", before="tweak_1"),
        Replace("use_3", mk("use_3b", requires=("art_3", "art_9"))),
        Fuse(["wrap_model", "build_optim_wrapper"], "init_engine"),
        Remove("use_11"),
        Configure("train", {"epochs": 2}),
    ],
)


def plan_as_json() -> str:
    plan = make_plan(wide_graph(), STRATEGY)
    return json.dumps(
        {
            "order": plan.order,
            "stages": plan.stages,
            "edges": [(e.source, e.target, e.reason) for e in plan.edges],
            "chains": dict(plan.graph.chains),
            "origins": {n: str(plan.origin(n)) for n in plan.order},
            "explain": [plan.explain(n) for n in plan.order],
        }
    )


def test_the_same_plan_every_time_in_one_process() -> None:
    first = plan_as_json()
    assert all(plan_as_json() == first for _ in range(5))


@pytest.mark.slow
def test_the_same_plan_in_twenty_fresh_processes_with_varied_hash_seeds() -> None:
    code = "import tests.core.test_determinism as t; print(t.plan_as_json())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(20)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out)
    assert len(set(outputs)) == 1
    assert json.loads(outputs[0])["order"] == list(make_plan(wide_graph(), STRATEGY).order)
