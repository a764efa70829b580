"""benchmarks/loop_overhead.py: every config shape runs end to end, and the report says per
shape what flexgraph and the hand loop cost and how the hand loop compares with itself.

The end-to-end run is the smallest there is (two iterations per epoch, one
round, one repeat), so no figure is checked, only that each one is printed.
The shapes themselves are checked for what makes them different from each
other: a benchmark whose shapes all looked alike would hide a cost again.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _loop_shapes  # noqa: E402 (benchmarks/ is not a package)
import loop_overhead  # noqa: E402

NUMBER = r"-?\d+\.\d+"


def _args(**given: object) -> argparse.Namespace:
    defaults = dict(shapes=",".join(_loop_shapes.SHAPES), iters=None, epochs=None, only=None,
                    with_mmengine=False)
    return argparse.Namespace(**{**defaults, **given})


def test_the_shapes_differ_in_epoch_length_model_size_and_a_scheduler_by_iteration():
    shapes = _loop_shapes.SHAPES.values()
    assert len({shape.iters for shape in shapes}) > 1
    assert len({shape.width for shape in shapes}) > 1
    assert {shape.scheduler for shape in shapes} == {True, False}
    short = _loop_shapes.SHAPES["short-epochs"]  # the config: 512 samples, batch 16
    assert (short.iters * short.batch, short.batch, short.optimizer) == (512, 16, "adamw")
    for shape in shapes:  # every shape measures its hand loop against itself
        hands = {loop_overhead.COMPARISONS[c][0] for c in shape.comparisons}
        calibrations = {loop_overhead.CALIBRATION_OF[hand] for hand in hands}
        assert calibrations <= set(shape.comparisons), shape.name


def test_a_scheduled_shape_steps_a_linear_lr_by_iteration_over_the_whole_run():
    shape = _loop_shapes.SHAPES["short-epochs"]
    (scheduler,) = _loop_shapes.scheduler_cfg(shape, epochs=3)
    assert scheduler["type"] == "LinearLR" and scheduler["by_epoch"] is False
    assert scheduler["end"] == 3 * shape.iters
    assert _loop_shapes.scheduler_cfg(_loop_shapes.SHAPES["tiny"], epochs=3) == []


def test_iters_and_epochs_replace_every_chosen_shapes_own():
    shapes = loop_overhead._chosen_shapes(_args(shapes="tiny,wide", iters=3, epochs="1,2"))
    assert [(s.name, s.iters, s.epochs) for s in shapes] == [("tiny", 3, (1, 2)),
                                                             ("wide", 3, (1, 2))]
    (own,) = loop_overhead._chosen_shapes(_args(shapes="short-epochs"))
    assert own == _loop_shapes.SHAPES["short-epochs"]


def test_only_replaces_each_shapes_comparisons_and_names_an_unknown_one():
    shapes = loop_overhead._chosen_shapes(_args(shapes="tiny,short-epochs"))
    sides = loop_overhead._sides(shapes, _args(only="api"))
    assert [(side.shape.name, side.name) for side in sides] == [("tiny", "api"),
                                                                ("short-epochs", "api")]
    own = loop_overhead._sides(shapes, _args())
    assert [side.name for side in own] == ["plain", "api", "terminal", "calibrate",
                                           "calibrate-api", "api", "calibrate-api"]
    with pytest.raises(SystemExit, match="no comparison"):
        loop_overhead._sides(shapes, _args(only="api,nonsense"))


def test_the_summary_puts_each_ratio_next_to_the_hand_loop_against_itself(capsys):
    (shape,) = loop_overhead._chosen_shapes(_args(shapes="short-epochs"))
    api, calibration = loop_overhead._sides([shape], _args())
    for flexgraph, hand, again in ((1.02, 1.0, 1.01), (1.08, 1.0, 0.99), (1.01, 1.0, 1.0)):
        api.record({"hand-api": {"cpu": hand, "wall": hand},
                    "flexgraph-api": {"cpu": flexgraph, "wall": flexgraph}})
        calibration.record({"hand-api": {"cpu": hand, "wall": hand},
                            "hand-api-again": {"cpu": again, "wall": again}})
    assert loop_overhead._summary([shape], [api, calibration]) is True  # median 1.02
    row = capsys.readouterr().out.splitlines()[-2]  # the guardrail's line follows
    assert re.match(r"\s+short-epochs\s+api\s+1\.020\s+1\.000\s+1\.020 \[1\.020\]\s+"
                    r"1\.000 \(min 0\.990, max 1\.010\)\s+ok$", row), row


def test_the_guardrail_holds_only_if_every_flexgraph_ratio_is_within_it(capsys):
    shapes = loop_overhead._chosen_shapes(_args(shapes="tiny,short-epochs"))
    sides = loop_overhead._sides(shapes, _args(only="api"))
    for side, cpu in zip(sides, (1.04, 1.12), strict=True):
        side.record({"hand-api": {"cpu": 1.0, "wall": 1.0},
                     "flexgraph-api": {"cpu": cpu, "wall": cpu}})
    assert loop_overhead._summary(shapes, sides) is False
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("guardrail, CPU time median <= 1.1 on every shape: NOT MET "
                       "(highest: short-epochs api 1.120)")
    assert out[-2].endswith(" over") and out[-3].endswith(" ok")
    assert loop_overhead._summary(shapes[:1], sides[:1]) is True
    assert capsys.readouterr().out.splitlines()[-1] == (
        "guardrail, CPU time median <= 1.1 on every shape: holds (highest: tiny api 1.040)")


def test_mmengines_runner_is_reported_but_not_held_to_the_guardrail(capsys):
    (shape,) = loop_overhead._chosen_shapes(_args(shapes="tiny"))
    (runner,) = [side for side in loop_overhead._sides([shape], _args(only="calibrate",
                                                                      with_mmengine=True))
                 if side.name == "mmengine"]
    runner.record({"hand-api": {"cpu": 1.0, "wall": 1.0},
                   "mmengine-api": {"cpu": 1.5, "wall": 1.5}})
    assert loop_overhead._summary([shape], [runner]) is True
    assert capsys.readouterr().out.splitlines()[-2].endswith(" -")


@pytest.mark.slow
def test_every_shape_runs_end_to_end_in_the_smallest_configuration(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "loop_overhead.py"), "--rounds", "1", "--iters", "2",
         "--epochs", "1,2", "--repeats", "1", "--only", "api,calibrate-api"],
        env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for name in _loop_shapes.SHAPES:
        assert re.search(rf"^shape {name}: 2 iterations per epoch, ", out, re.M), out
        assert re.search(rf"^\s+{name}\s+api\s+{NUMBER}\s+{NUMBER}\s+{NUMBER} \[{NUMBER}\]\s+"
                         rf"{NUMBER} \(min {NUMBER}, max {NUMBER}\)\s+(ok|over)$", out, re.M), out
    assert "LinearLR by iteration" in out
    assert re.search(r"^guardrail, CPU time median <= 1.1 on every shape: (holds|NOT MET) "
                     r"\(highest: ", out, re.M), out
    # every child's work_dir went with its temporary folder (torch may leave its compile cache)
    assert [p for p in tmp_path.iterdir() if not p.name.startswith("torchinductor")] == []


def test_lockstep_trains_both_sides_together_and_fills_until_the_partner_is_done(tmp_path):
    """Two sides of a pair (threads here, processes in the benchmark): the one with
    the short setup waits to train until the other does, and the one done first
    trains on (fills) until the other is done; outside a timed run nothing waits."""
    events: list[str] = []
    fills = {"quick": 0, "slow": 0}

    def side(name: str, partner: str, setup_s: float, train_s: float) -> None:
        def fill() -> None:
            fills[name] += 1
            time.sleep(0.005)

        lockstep = loop_overhead._Lockstep(str(tmp_path / name), str(tmp_path / partner), fill)
        lockstep.at_training()  # not armed (warm-up, filler): returns at once
        lockstep.start()
        time.sleep(setup_s)
        events.append(f"{name} set up")
        lockstep.at_training()
        events.append(f"{name} trains")
        time.sleep(train_s)
        events.append(f"{name} trained")
        lockstep.finish()
        events.append(f"{name} finished")

    threads = [threading.Thread(target=side, args=("quick", "slow", 0.0, 0.0), daemon=True),
               threading.Thread(target=side, args=("slow", "quick", 0.1, 0.1), daemon=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert events.index("slow set up") < events.index("quick trains")
    assert events.index("slow trained") < events.index("quick finished")
    assert fills["slow"] == 0 and fills["quick"] >= 1
