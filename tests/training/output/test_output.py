"""Output sinks: metrics.jsonl records, the visualizer's backends, the rich progress path,
non-finite values."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.visualization import Visualizer

from flexgraph.training.config import LogProcessorPolicy
from flexgraph.training.output import TrainOutput
from flexgraph.training.output._train_output import _BAR_CPU_SHARE


def _visualizer(tmp_path, *backends):
    return Visualizer.get_instance(f"test_output_{tmp_path.name}", save_dir=str(tmp_path),
                                   vis_backends=[dict(type=b) for b in backends])


def _output(tmp_path, interactive, visualizer=None, logger=None):
    logger = logger or logging.getLogger("t")
    return TrainOutput(work_dir=str(tmp_path), is_main=True, logger=logger,
                       message_hub=MessageHub.get_instance(f"test_output_{logger.name}"),
                       log_interval=2, max_iters=6, max_epochs=1, by_epoch=False,
                       epoch_length=6, interactive=interactive, visualizer=visualizer)


def _terminal_output(tmp_path, logger):
    """An output drawing its bar (``interactive``), its lines at the INFO level."""
    logger.setLevel(logging.INFO)
    return _output(tmp_path, interactive=True, logger=logger)


def test_records_are_json_lines_even_for_nan_and_dicts(tmp_path):
    out = _output(tmp_path, interactive=False,
                  visualizer=_visualizer(tmp_path, "TensorboardVisBackend"))
    out.open(0)
    for value in (torch.tensor(1.5), torch.tensor(float("nan"))):
        out.values.append(value)
        out.lrs.append(0.1)
    out.log(2, 0, 2)
    out.values.append({"loss": torch.tensor(2.0), "loss_aux": torch.tensor(0.5)})
    out.lrs.append(0.05)
    out.flush(0)
    out.eval_metrics({"acc": torch.tensor(0.75)}, mode="val", iters_done=3, epoch=1)
    out.eval_metrics({"top1": 0.5}, mode="test", iters_done=3, epoch=1)
    out.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
               .splitlines()]
    assert records[0] == {"iter": 1, "epoch": 1, "loss": 1.5, "lr": 0.1}
    assert records[1]["iter"] == 2 and records[1]["loss"] != records[1]["loss"]  # NaN
    assert records[2] == {"iter": 3, "epoch": 1, "loss": 2.0, "loss_aux": 0.5, "lr": 0.05}
    assert records[3] == {"mode": "val", "iter": 3, "epoch": 1, "acc": 0.75}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "vis_data"))
    events.Reload()  # MMEngine's LoggerHook's tags; no test metrics (nor does it)
    assert set(events.Tags()["scalars"]) == {"loss", "lr", "iter", "acc"}
    assert [(e.step, e.value) for e in events.Scalars("acc")] == [(3, 0.75)]


def _scalar_lines(folder: Path, name: str = "scalars.json") -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


def test_a_local_backend_writes_the_lines_values_and_metrics_jsonl_the_raw_ones(tmp_path):
    out = TrainOutput(work_dir=str(tmp_path), is_main=True, logger=logging.getLogger("t"),
                      message_hub=MessageHub.get_instance(f"test_output_{tmp_path.name}"),
                      log_interval=2, max_iters=6, max_epochs=1, by_epoch=False,
                      epoch_length=6, interactive=False, timestamp="20260101_000000",
                      visualizer=_visualizer(tmp_path, "LocalVisBackend"))
    out.open(0)
    for i in (1, 2):
        out.keep(torch.tensor(float(i)))
        out.lrs.append(0.1 * i)
    out.log(2, 0, 2)
    out.eval_metrics({"acc": 0.5}, mode="val", iters_done=2, epoch=1)
    out.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "vis_data"]
    assert _scalar_lines(tmp_path / "vis_data") == [
        {"loss": 1.5, "lr": 0.2, "iter": 2, "step": 2}, {"acc": 0.5, "step": 2}]
    assert _scalar_lines(tmp_path / "vis_data", "20260101_000000.json") == _scalar_lines(
        tmp_path / "vis_data")
    assert [r["loss"] for r in _scalar_lines(tmp_path, "metrics.jsonl")[:2]] == [1.0, 2.0]


def test_without_a_visualizer_the_default_ones_files_are_written(tmp_path):
    out = TrainOutput(work_dir=str(tmp_path), is_main=True, logger=logging.getLogger("t"),
                      message_hub=MessageHub.get_instance(f"test_default_{tmp_path.name}"),
                      log_interval=2, max_iters=2, max_epochs=1, by_epoch=True,
                      epoch_length=2, interactive=False, timestamp="20260101_000000",
                      vis_dir=str(tmp_path / "run" / "vis_data"))
    out.open(0)
    for i in (1, 2):
        out.keep({"loss": torch.tensor(float(i)), "loss_aux": torch.tensor(3.0)})
        out.lrs.append(0.1)
    out.log(2, 0, 2)
    out.close()
    assert _scalar_lines(tmp_path / "run" / "vis_data") == [
        {"loss": 1.5, "loss_aux": 3.0, "lr": 0.1, "epoch": 1, "iter": 2, "step": 2}]


def test_rich_progress_path_updates_the_bar(tmp_path):
    out = _output(tmp_path, interactive=True)
    out.open(0)
    next_tick = out.tick(0)
    assert next_tick >= 1
    for i in range(1, 7):
        out.values.append(torch.tensor(float(i)))
        out.lrs.append(0.1)
        if i % 2 == 0:
            out.log(i, 0, i)
    out.tick(6)
    done, elapsed, remaining, status = out._bar.shown
    assert (done, remaining, status) == (6, 0.0, "loss 6.0000")
    assert elapsed > 0
    out.close()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 6


def test_records_of_same_keys_match_the_general_path(tmp_path):
    """MMEngine log_vars have the same keys every iteration; an infinity among them is
    written as JSON's Infinity."""
    out = _output(tmp_path, interactive=False)
    out.open(0)
    rows = [{"loss": torch.tensor(0.25 * i), 'top%"1': torch.tensor(1.0 / (i + 3))}
            for i in range(3)]
    for row in rows:
        out.values.append(row)
        out.lrs.append(0.1)
    out.flush(0)
    out.values.append({"loss": torch.tensor(float("inf")), 'top%"1': torch.tensor(0.5)})
    out.lrs.append(0.1)
    out.flush(0)  # a non-finite value: the general path
    out.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines[:3]] == [
        {"iter": i + 1, "epoch": 1, "loss": row["loss"].item(), 'top%"1': row['top%"1'].item(),
         "lr": 0.1} for i, row in enumerate(rows)]
    assert json.loads(lines[3])["loss"] == float("inf")
    assert out.last_values['top%"1'] == 0.5


def test_lines_above_the_bar_go_out_with_its_next_tick_at_the_log_level(tmp_path, capsys):
    logger = logging.getLogger("test_output.terminal")
    out = _terminal_output(tmp_path, logger)
    out.open(0)
    out.info("first line")
    out.info("second line")
    assert "first line" not in capsys.readouterr().out  # one redraw for both, at the tick
    out.tick(1)
    printed = capsys.readouterr().out
    assert printed.index("first line") < printed.index("second line")
    logger.setLevel(logging.WARNING)  # e.g. log_level='WARNING': no INFO lines, bar or not
    out.info("not shown")
    out.close()
    assert "not shown" not in capsys.readouterr().out


def test_a_line_wider_than_the_terminal_goes_above_the_bar_whole(tmp_path, capsys,
                                                                  monkeypatch):
    """The terminal wraps it: copied from the screen, it is the line in the log file."""
    monkeypatch.setenv("COLUMNS", "40")
    out = _terminal_output(tmp_path, logging.getLogger("test_output.wide"))
    out.open(0)
    line = " ".join(f"word{i}" for i in range(30))  # 200 columns
    out.info(line)
    out.tick(1)
    out.close()
    assert line in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(("window", "means"), [
    (10, ["1.5000", "2.5000", "3.5000"]),  # MMEngine's default: the last 10 iterations
    (2, ["1.5000", "3.5000", "5.5000"]),
])
def test_lines_due_together_come_out_in_order_with_their_own_values(tmp_path, caplog, window,
                                                                    means):
    """Each line is composed from the iterations up to its own (a mean over the log
    processor's window)."""
    out = TrainOutput(work_dir=str(tmp_path), is_main=True, logger=logging.getLogger("t"),
                      message_hub=MessageHub.get_instance(f"test_together_{window}"),
                      log_interval=2, max_iters=6, max_epochs=1, by_epoch=False,
                      epoch_length=6, interactive=False,
                      log_processor=LogProcessorPolicy(window_size=window))
    out.logger.setLevel(logging.INFO)
    out.open(0)
    for i in range(1, 7):
        out.keep(torch.tensor(float(i)))
        out.lrs.append(0.1)
        if i % 2 == 0:
            out.log(i, 0, i)
    out.flush(0)
    out.close()
    lines = [r.getMessage() for r in caplog.records if "Iter(train)" in r.getMessage()]
    assert [line.split("loss: ")[1] for line in lines] == means
    assert [line.split("]")[0] for line in lines] == [
        "Iter(train) [2/6", "Iter(train) [4/6", "Iter(train) [6/6"]


def test_the_cpu_keeps_numbers_and_an_accelerator_keeps_detached_tensors(tmp_path):
    loss = torch.tensor(2.0, requires_grad=True) * 1.5
    on_cpu = _output(tmp_path, interactive=False)
    on_cpu.keep(loss)
    on_cpu.keep({"loss": loss, "acc": 0.5})
    assert on_cpu.values == [3.0, {"loss": 3.0, "acc": 0.5}]
    assert type(on_cpu.values[0]) is float
    elsewhere = TrainOutput(work_dir=str(tmp_path), is_main=True, logger=logging.getLogger("t"),
                            message_hub=MessageHub.get_instance("test_output_gpu"),
                            log_interval=2, max_iters=6, max_epochs=1, by_epoch=False,
                            epoch_length=6, interactive=False, device="cuda")
    elsewhere.keep(loss)
    elsewhere.keep({"loss": loss, "acc": loss})
    kept, kept_dict = elsewhere.values
    assert isinstance(kept, torch.Tensor) and not kept.requires_grad and kept.item() == 3.0
    assert not kept_dict["loss"].requires_grad and not kept_dict["acc"].requires_grad


def test_a_dict_of_the_loss_alone_is_recorded_as_a_bare_loss_is(tmp_path):
    """BaseModel.train_step's {'loss': x} is kept as x, and its records read as a bare
    loss's do, alone or between dicts of more keys."""
    outputs = []
    for values in ([{"loss": torch.tensor(float(i))} for i in range(1, 5)],
                   [torch.tensor(float(i)) for i in range(1, 5)],
                   [{"loss": torch.tensor(1.0)}, {"loss": torch.tensor(2.0), "acc": 0.5},
                    torch.tensor(3.0), {"loss": torch.tensor(4.0)}]):
        run_dir = tmp_path / str(len(outputs))
        run_dir.mkdir()
        out = _output(run_dir, interactive=False)
        out.open(0)
        for value in values:
            out.keep(value)
            out.lrs.append(0.1)
        if len(outputs) < 2:
            assert all(type(v) is float for v in out.values)
        out.log(4, 0, 4)
        out.flush(0)
        out.close()
        outputs.append([json.loads(line) for line in (run_dir / "metrics.jsonl").open()])
    assert outputs[0] == outputs[1]
    assert [r["loss"] for r in outputs[2]] == [1.0, 2.0, 3.0, 4.0]
    assert [r.get("acc") for r in outputs[2]] == [None, 0.5, None, None]


def _spend_cpu(seconds: float) -> None:
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


class _CountingBar:
    """A bar that counts its redraws."""

    def __init__(self) -> None:
        self.redraws = 0

    def show(self, *args: object, **kwargs: object) -> None:
        self.redraws += 1

    def stop(self) -> None:
        pass


def test_the_bar_is_redrawn_a_few_times_a_second_whatever_the_speed(tmp_path):
    """Fast iterations share a redraw (about four a second); an iteration slower than
    that gets its own."""
    out = TrainOutput(work_dir=str(tmp_path), is_main=True, logger=logging.getLogger("t"),
                      message_hub=MessageHub.get_instance("test_output_ticks"),
                      log_interval=10**6, max_iters=10**6, max_epochs=1, by_epoch=False,
                      epoch_length=10**6, interactive=False)
    out.open(0)
    out._bar = bar = _CountingBar()
    next_tick = out.tick(0)
    assert next_tick == 1  # no iteration yet: the speed is not known
    start = time.perf_counter()
    for it in range(1, 801):
        time.sleep(0.001)
        if it >= next_tick:
            next_tick = out.tick(it)
    elapsed = time.perf_counter() - start
    assert 2 <= bar.redraws <= 2 * 4 * elapsed + 3, (bar.redraws, elapsed)
    slow = 800
    assert out.tick(slow) > slow + 1  # after the fast iterations: a stride of many
    _spend_cpu(0.3)
    slow += 1
    assert out.tick(slow) == slow + 1  # after a slow one: the next iteration
    out._bar = None
    out.close()


class _CostlyBar:
    """A bar whose every redraw costs 5 ms of CPU (a real one: about 1 ms)."""

    def __init__(self) -> None:
        self.redraws = 0

    def show(self, *args: object, **kwargs: object) -> None:
        self.redraws += 1
        _spend_cpu(0.005)

    def stop(self) -> None:
        pass


def test_the_bars_redraws_stay_under_their_share_of_the_cpu_time(tmp_path):
    """Four ticks a second would spend 2% of this loop's CPU time on 5 ms redraws
    (more on a busy machine, where a second of wall time holds less CPU time);
    once a redraw's cost is known, the stride stretches until the redraws take
    at most _BAR_CPU_SHARE of the loop's CPU time."""
    out = TrainOutput(work_dir=str(tmp_path), is_main=True, logger=logging.getLogger("t"),
                      message_hub=MessageHub.get_instance("test_output_share"), log_interval=10**6,
                      max_iters=10**6, max_epochs=1, by_epoch=False, epoch_length=10**6,
                      interactive=False)
    out.open(0)
    out._bar = bar = _CostlyBar()
    assert out.tick(0) == 1  # the first redraw, before the speed is known
    _spend_cpu(0.00025)
    next_tick = out.tick(1)  # the speed and a redraw's cost known from here
    start, redraws = time.process_time(), bar.redraws
    for it in range(2, 4002):  # 0.25 ms of CPU an iteration: one CPU second in all
        _spend_cpu(0.00025)
        if it >= next_tick:
            next_tick = out.tick(it)
    later = (bar.redraws - redraws) * 0.005 / (time.process_time() - start)
    assert later <= 1.5 * _BAR_CPU_SHARE, (bar.redraws, later)
    out._bar = None
    out.close()
