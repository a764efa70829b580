"""``flexgraph plan --compare`` / ``--strategy auto`` as users run them (real processes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

PARTS = {"parameters", "gradients", "optimizer", "activations", "buffers"}


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexgraph", "plan", *args],
                          capture_output=True, text=True, timeout=120)


def test_compare_json_has_a_row_per_candidate_with_its_parts(tiny_vit) -> None:
    done = _plan(str(tiny_vit), "--compare", "ddp,ddp:bf16,deepspeed:zero1:fp16,fsdp",
                 "--world-size", "2", "--device-memory", "16GB", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "flexgraph.estimate/1"
    assert [c["candidate"] for c in report["candidates"]] == [
        "ddp", "ddp:bf16", "deepspeed:zero1:fp16", "fsdp"]
    for row in report["candidates"]:
        assert set(row["parts"]) == PARTS
        assert row["peak_bytes"] == sum(row["parts"].values())
        assert row["fits"] is True
    ddp, ddp_bf16, zero1, fsdp = report["candidates"]
    assert ddp_bf16["traced_activations_bytes"] < ddp["traced_activations_bytes"]
    # on CUDA (a --device-memory) AdamW's foreach step takes one fp32 copy of what it steps
    assert ddp["step_temporaries_bytes"] == ddp["parts"]["parameters"]
    assert zero1["step_temporaries_bytes"] * 2 == ddp["step_temporaries_bytes"]
    # master weights + Adam's two states (4 + 8 bytes) over 2 ranks, against Adam's 8
    assert _states(zero1) == pytest.approx(_states(ddp) * 3 / 4, rel=1e-3)
    assert fsdp["parts"]["parameters"] * 2 == ddp["parts"]["parameters"]
    assert report["parameters"]["total"] == report["parameters"]["trainable"] > 5e6


def _states(row: dict) -> int:
    """The optimizer's states: its part, less the step's temporaries when the step peaks."""
    at_step = row["parts"]["activations"] == 0
    return row["parts"]["optimizer"] - (row["step_temporaries_bytes"] if at_step else 0)


def test_compare_table_and_a_bad_candidate(tiny_vit) -> None:
    done = _plan(str(tiny_vit), "--compare", "ddp,deepspeed:zero3", "--device-memory", "1MB")
    assert done.returncode == 0, done.stderr
    assert "deepspeed:zero3" in done.stdout and "NO" in done.stdout
    bad = _plan(str(tiny_vit), "--compare", "ddp:zero9")
    assert bad.returncode == 2 and "ddp has no stages" in bad.stderr


@pytest.mark.parametrize("world, chosen", [("1", "single"), ("2", "ddp")])
def test_strategy_auto_picks_the_cheapest_that_fits(tiny_vit, world: str, chosen: str) -> None:
    done = _plan(str(tiny_vit), "--strategy", "auto", "--world-size", world,
                 "--device-memory", "16GB", "--format", "json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["strategy"] == chosen
    assert plan["estimate"]["auto"]["choice"] == chosen
    assert "fits" in plan["estimate"]["auto"]["reason"]


def test_strategy_auto_names_the_smallest_when_nothing_fits(tiny_vit) -> None:
    done = _plan(str(tiny_vit), "--strategy", "auto", "--world-size", "2",
                 "--device-memory", "10MB")
    assert done.returncode == 2
    assert "smallest estimate is deepspeed:zero3" in done.stderr
