"""The progress record a launched rank keeps for its launcher (flexgraph.training.output)."""

from __future__ import annotations

from flexgraph.training.output import Progress, read_progress


def test_the_record_holds_the_last_step_and_iteration(tmp_path):
    assert read_progress(tmp_path, 3) == {}
    progress = Progress(tmp_path / "rank3")
    progress.step("a_step_with_a_rather_long_name_to_leave_a_tail")
    assert read_progress(tmp_path, 3) == {
        "step": "a_step_with_a_rather_long_name_to_leave_a_tail", "iter": None, "every": None}
    progress.step("train")
    progress.iteration(40, every=10)
    progress.iteration(50, every=10)
    assert read_progress(tmp_path, 3) == {"step": "train", "iter": 50, "every": 10}
