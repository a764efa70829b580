"""``env_cfg.stall_timeout`` and ``env_cfg.shutdown_timeout``: their reading, the limits they
give each phase, and the process group's timeout derived from them."""

from __future__ import annotations

import warnings

import pytest

from flexgraph.training.config import (
    WatchPolicy,
    collective_timeout,
    read_settings,
    watch_policy,
)
from flexgraph.training.config._keys import unused_keys
from flexgraph.training.config._watch import LONG_PHASE_ALLOWANCE
from flexgraph.training.errors import ConfigError


def test_the_defaults_come_from_what_the_run_has_seen():
    policy = watch_policy({})
    assert policy == WatchPolicy(stall_timeout=None, shutdown_timeout=30.0)
    assert policy.enabled
    assert policy.limit("iteration") == 300  # the floor
    assert policy.limit("iteration", slowest=60) == 600  # ten slowest iterations
    for phase in ("first iteration", "setup", "evaluation", "save"):
        assert policy.limit(phase) == LONG_PHASE_ALLOWANCE
        assert policy.limit(phase, slowest=400) == 4000  # the larger of the two


def test_a_bound_is_given_in_seconds_and_zero_turns_the_watchdog_off():
    cfg = {"env_cfg": {"stall_timeout": 20, "shutdown_timeout": 10}}
    policy = read_settings({**cfg, "work_dir": "w"}).watch
    assert (policy.stall_timeout, policy.shutdown_timeout) == (20.0, 10.0)
    assert policy.limit("iteration", slowest=100) == 20  # a bound given wins over the seen
    assert policy.limit("save") == LONG_PHASE_ALLOWANCE
    assert not watch_policy({"env_cfg": {"stall_timeout": 0}}).enabled
    assert not list(unused_keys(cfg))  # both keys are acted on


def test_torch_elastics_shutdown_timeout_is_the_default_grace():
    assert watch_policy({}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "12"}).shutdown_timeout == 12
    given = {"env_cfg": {"shutdown_timeout": 3}}
    assert watch_policy(given, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "12"}).shutdown_timeout == 3


@pytest.mark.parametrize("value", [-1, "300", True, [5]])
def test_a_bound_that_is_no_number_of_seconds_is_refused_by_name(value):
    with pytest.raises(ConfigError, match=r"env_cfg.stall_timeout must be a number of seconds"):
        watch_policy({"env_cfg": {"stall_timeout": value}})


def test_the_process_groups_timeout_outlasts_every_limit_of_the_watchdog():
    policy = WatchPolicy(stall_timeout=2400)
    assert collective_timeout(policy) > max(policy.limit(p) for p in
                                            ("iteration", "setup", "evaluation", "save"))
    assert collective_timeout(WatchPolicy(stall_timeout=0)) == 1800  # torch's default


def test_a_given_collective_timeout_shorter_than_the_limits_is_kept_with_a_warning():
    from flexgraph.training.runtime._distributed import _watched_timeout

    cfg = {"env_cfg": {"stall_timeout": 20}}
    with pytest.warns(UserWarning, match=r"dist_cfg.timeout=600 s is shorter than the "
                                         r"watchdog's limits"):
        assert _watched_timeout(cfg, 600) == 600
    assert _watched_timeout(cfg, None) == collective_timeout(watch_policy(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _watched_timeout({"env_cfg": {"stall_timeout": 0}}, 600) == 600
        assert _watched_timeout(cfg, 7200) == 7200
