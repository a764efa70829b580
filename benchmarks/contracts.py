"""What the contracts cost: time to the first iteration with them and without them.

A contract is a check the executor runs around a setup step (see
``flexgraph.core.executor``). Each command runs twice per round, contracts on
and off (``FLEXGRAPH_BENCH_CONTRACTS=off``, read by ``_contracts_switch/
sitecustomize.py``, which this benchmark alone puts on the children's
``PYTHONPATH``, in both modes), interleaved in rounds (``_harness.py``):

* ``startup.py``'s ``flexgraph run`` of the tiny BaseModel config, one process
  (process start to the end of the first iteration);
* ``setup_memory.py``'s flexgraph rows (``--rows``, default DDP, FSDP with
  ``load_from`` and ZeRO-3 with ``load_from``: the rows whose setup shards,
  loads and checks the most), ``--nproc`` ranks, time from launch to the end
  of setup on the last rank.

Printed: each command's median time on and off, and the median of the
per-round ratios on/off (the goal: at most 1.02). On a busy machine that ratio
drowns in noise, so each round also runs the command a third time with the
contracts timed where they run (``timed``: each process prints its total time
in them) and the share of the time to the first iteration they took is
printed too (the slowest rank's total, for the multi-rank rows). Run::

    python benchmarks/contracts.py [--runs 5] [--size 20M] [--nproc 2] [--rounds 3]
        [--rows ddp,fsdp-load,zero3-load]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import setup_memory
import startup
from _harness import interleave

HERE = Path(__file__).resolve().parent
SWITCH = HERE / "_contracts_switch"
MODES = ("on", "off", "timed")
SPENT = re.compile(r"contracts-seconds ([0-9.e-]+)")


def _with_switch(env: dict[str, str], mode: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(SWITCH), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "FLEXGRAPH_BENCH_CONTRACTS": mode}


def time_startup(runs: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    seen: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        config = startup._write_config(Path(tmp), "tiny_basemodel_cfg", "TinyBaseModel")
        count = iter(range(10**6))

        def run(mode: str) -> float | tuple[float, float]:
            argv = [sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir",
                    f"{tmp}/work_{next(count)}"]
            if mode != "timed":
                return startup._time_to_stamp(argv, tmp, _with_switch(env, mode), seen).wall
            start = time.time()
            done = subprocess.run(argv, cwd=tmp, env=_with_switch(env, mode), text=True,
                                  capture_output=True, timeout=startup.TIMEOUT_S)
            stamp = next(line for line in done.stdout.splitlines()
                         if line.startswith(startup._tiny.STAMP))
            return _spent(done.stdout) / (float(stamp.split()[1]) - start)

        rounds = interleave({mode: (lambda mode=mode: run(mode)) for mode in MODES}, runs)
    _report("flexgraph run, BaseModel (startup.py)", rounds)


def time_setup(args: argparse.Namespace) -> None:
    plain_env = setup_memory._env
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = root / "weights.pth"
        setup_memory.write_weights(args, weights)
        rows = setup_memory.all_rows(args.width)
        counter = iter(range(10**6))
        for key in args.rows.split(","):

            def run(mode: str, row=rows[key]) -> float:
                setup_memory._env = lambda: _with_switch(plain_env(), mode)
                n = next(counter)
                outcome = setup_memory.run_row(row, args, root / mode, weights, n)
                if outcome.seconds is None:
                    raise RuntimeError(f"{row.label}, contracts {mode}: {outcome.note}")
                if mode == "timed":
                    log = root / mode / f"{row.key}-{n}" / "run.log"
                    return _spent(log.read_text(errors="replace")) / outcome.seconds
                return outcome.seconds

            rounds = interleave({mode: (lambda mode=mode: run(mode)) for mode in MODES},
                                args.rounds)
            _report(f"{rows[key].label} (setup_memory.py, {args.size}, {args.nproc} ranks)",
                    rounds)


def _spent(output: str) -> float:
    """The largest per-process total of the ``contracts-seconds`` lines in ``output``."""
    return max((float(x) for x in SPENT.findall(output)), default=0.0)


def _report(what: str, rounds) -> None:
    print(f"{what}: on {rounds.of('on').median:.3f} s, off {rounds.of('off').median:.3f} s, "
          f"on/off {rounds.ratio('on', 'off')}; time in contracts / time to the first "
          f"iteration {rounds.of('timed'):.1e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="startup rounds")
    parser.add_argument("--rows", default="ddp,fsdp-load,zero3-load")
    parser.add_argument("--skip-setup", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    args, rest = parser.parse_known_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    if not args.skip_startup:
        time_startup(args.runs)
    if not args.skip_setup:
        setup = setup_memory.parse_args(rest)
        setup.rows = args.rows
        time_setup(setup)


if __name__ == "__main__":
    main()
