"""MMDetection's EMA (``EMAHook`` with ``ExpMomentumEMA``, as RTMDet's configs ship it) on ATSS.

The installed ATSS config (:mod:`mmdet_coco`: its own small COCO set, 128 px,
two epochs, fp32) with the ``EMAHook`` entry of the installed RTMDet-L config,
which averages buffers too (``update_buffers=True``), on two processes. The
averaged weights each strategy saves follow DDP's as its training does.
"""

from __future__ import annotations

import pytest

from tests.ecosystem.mmdet_coco import flexgraph_run, overrides, write_coco, write_wrapper
from tests.ecosystem.mmpretrain_configs import saved_weights

pytestmark = pytest.mark.slow

pytest.importorskip("mmdet", reason="make test-ecosystem installs mmdet with mmcv's operators")


def _rtmdet_ema_hook() -> dict:
    """The ``EMAHook`` entry of the installed RTMDet-L config."""
    from mmengine.config import Config

    from tests.ecosystem.mmdet_coco import config_path

    folder = config_path("atss").parents[1]
    hooks = Config.fromfile(folder / "rtmdet" / "rtmdet_l_8xb32-300e_coco.py").custom_hooks
    return next(dict(h) for h in hooks if h["type"] == "EMAHook")


@pytest.fixture(scope="module")
def root(module_folder):
    root = module_folder
    data = write_coco(root / "data")
    write_wrapper(root, "atss", data, f"custom_hooks = [{_rtmdet_ema_hook()!r}]")
    return root


def _train(root, strategy):
    return flexgraph_run(root / "atss.py", root / strategy, overrides("atss", strategy),
                         cwd=root)


@pytest.fixture(scope="module")
def ddp(root):
    done = _train(root, "ddp")
    assert done.returncode == 0, done.stderr[-4000:]
    return saved_weights(root / "ddp", 2)


@pytest.mark.parametrize("strategy", ["fsdp", pytest.param("zero2", marks=pytest.mark.long),
                                      pytest.param("zero3", marks=pytest.mark.long)])
def test_the_average_follows_ddp_s(root, ddp, strategy):
    done = _train(root, strategy)
    assert done.returncode == 0, done.stderr[-4000:]
    averaged = saved_weights(root / strategy, 2)
    assert set(averaged) == set(ddp)
    for key, value in ddp.items():
        worst = (averaged[key].double() - value.double()).abs().max().item()
        assert worst <= 1e-5, f"{strategy}: averaged {key} off DDP's by {worst}"
