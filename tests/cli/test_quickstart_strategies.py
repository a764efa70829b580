"""The quickstart under each strategy its comments offer, changing only the ``strategy`` line.

The docs (docs/guide/getting_started.rst) promise that a user switches strategy
by uncommenting one line of ``examples/quickstart.py``; each test does exactly
that to a copy of the file and trains it for one epoch with ``flexgraph run
--nproc-per-node 2`` (gloo).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.cli_helpers import QUICKSTART, launch_two, train_losses

SOURCE = QUICKSTART.read_text()


def _commented_strategies(source: str) -> dict[str, tuple[str, str]]:
    """``{type: (commented text, live text)}`` for each ``# strategy = dict(...)`` statement."""
    found, lines = {}, source.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("# strategy = dict("):
            continue
        block = [line]
        while sum(b.count("(") - b.count(")") for b in block) > 0:
            block.append(lines[i + len(block)])
        live = "\n".join([block[0][2:]] + [b[1:] for b in block[1:]])
        found[re.search(r'type="(\w+)"', live).group(1)] = ("\n".join(block), live)
    return found


STRATEGIES = _commented_strategies(SOURCE)


def test_the_quickstart_offers_ddp_fsdp_and_deepspeed():
    assert set(STRATEGIES) == {"DDPStrategy", "FSDPStrategy", "DeepSpeedStrategy"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["FSDPStrategy", "DeepSpeedStrategy"])
def test_the_quickstart_trains_with_its_strategy_line_uncommented(tmp_path, name):
    if name == "DeepSpeedStrategy":
        pytest.importorskip("deepspeed")
    config = tmp_path / "quickstart.py"
    commented, live = STRATEGIES[name]
    config.write_text(SOURCE.replace(commented, live))
    done = launch_two(config, "work", tmp_path, "--cfg-options", "train_cfg.max_epochs=2",
                      "train_cfg.val_interval=2")
    assert f"strategy {name.removesuffix('Strategy').lower()}" in done.stdout
    losses = list(train_losses(tmp_path / "work").values())
    records = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").open()]
    assert len(losses) == 46 and sum(losses[-5:]) < 0.7 * sum(losses[:5]), "the loss goes down"
    (accuracy,) = [r["accuracy/top1"] for r in records if r.get("mode") == "val"]
    assert accuracy > 0.8
