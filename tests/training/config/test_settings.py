"""The run's settings: read from the config once, before any step runs."""

from __future__ import annotations

import attrs
import pytest
from mmengine.config import Config

from flexgraph.cli.main import main
from flexgraph.training.config import LogProcessorPolicy, RunSettings, read_settings
from flexgraph.training.errors import ConfigError
from flexgraph.training.graph import standard_graph
from tests.training.training_helpers import EXAMPLES


def test_every_section_the_runtime_acts_on_is_read_into_one_frozen_value():
    cfg = Config.fromfile(str(EXAMPLES / "quickstart.py"))
    cfg.merge_from_dict({"resume": True, "load_from": "w.pth",
                         "default_hooks.logger.interval": 7})
    settings = read_settings(cfg)
    assert settings.work_dir == "work_dirs/quickstart"
    assert settings.experiment_name == "quickstart"
    assert settings.resume == "w.pth" and settings.weights_to_load() is None, \
        "resume=True resumes from load_from, which then is not loaded twice"
    assert settings.logger.interval == 7
    assert settings.train.schedule(epoch_length=10).max_iters == 10 * cfg.train_cfg.max_epochs
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        settings.work_dir = "elsewhere"


def test_the_standard_graph_takes_the_settings_as_an_input_beside_cfg():
    graph = standard_graph()
    assert graph.inputs == {"cfg", "settings", "run_context"}
    readers = {step.name for step in graph if "settings" in step.inputs}
    assert {"build_checkpointer", "load_checkpoint", "resume", "train"} <= readers
    assert not {"build_checkpointer", "load_checkpoint", "resume"} & {
        step.name for step in graph if "cfg" in step.inputs}, "they read settings, not cfg"


def test_an_evaluation_run_needs_no_train_cfg_but_training_does():
    settings = read_settings({"work_dir": "w"})
    assert isinstance(settings, RunSettings) and settings.train is None
    with pytest.raises(ConfigError, match="training needs max_epochs"):
        settings.train_schedule(epoch_length=4)


def test_a_contradictory_section_fails_the_run_before_any_step_or_record(tmp_path, capsys):
    config = tmp_path / "cfg.py"
    config.write_text((EXAMPLES / "quickstart.py").read_text()
                      + "\ntrain_cfg = dict(type='FancyLoop', max_epochs=1)\n")
    assert main(["run", str(config), "--work-dir", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "train_cfg.type='FancyLoop' is not supported" in err
    assert not (tmp_path / "never").exists(), "no step ran and no record was opened"


def test_log_processor_is_read_with_mmengines_defaults_and_its_options():
    assert read_settings({}).logger.processor == LogProcessorPolicy()  # by_epoch: the loop's
    custom = [dict(data_src="loss", method_name="max", window_size="epoch", log_name="top")]
    processor = read_settings({"log_processor": dict(type="LogProcessor", window_size=4,
                                                     custom_cfg=custom)}).logger.processor
    assert (processor.window_size, processor.by_epoch) == (4, True)  # MMEngine's default
    assert processor.custom_cfg == tuple(custom)


@pytest.mark.parametrize("log_processor, match", [
    (dict(type="MyLogProcessor"), "type='MyLogProcessor' is not supported"),
    (dict(window_sise=5), r"no option \['window_sise'\]"),
    (dict(window_size="global"), "window_size must be an int >= 1"),
    (dict(custom_cfg=[dict(data_src="loss")]), r"custom_cfg\[0\] must be a dict with"),
    (dict(custom_cfg=[dict(data_src="loss", method_name="median")]), "'median' is not one of"),
    (dict(custom_cfg=[dict(data_src="loss", method_name="current", window_size=3)]),
     "'current' takes no window_size"),
    (dict(by_epoch=False, custom_cfg=[dict(data_src="loss", method_name="mean",
                                           window_size="epoch")]), "needs log_processor.by_epoch"),
    (dict(custom_cfg=[dict(data_src="loss", method_name="max"),
                      dict(data_src="loss", method_name="min")]), r"names \['loss'\] twice"),
])
def test_a_log_processor_mmengine_would_refuse_is_refused_by_name(log_processor, match):
    with pytest.raises(ConfigError, match=match):
        read_settings({"log_processor": log_processor})
