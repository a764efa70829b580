"""What setup costs each rank: peak memory before the first iteration, and the time to it.

One MMEngine ``BaseModel`` of about 450 M parameters (``--size``; the memory
benchmark's residual MLP, ``--blocks`` blocks) whose weights come from
MMEngine's ``init_cfg`` (``TruncNormal`` on every ``Linear``, ``Constant`` on
every ``LayerNorm``), 4 CPU processes over gloo (``--nproc``), fp32, torch's
AdamW built, then the first iteration's forward. Every row runs in fresh
processes:

* flexgraph rows, ``flexgraph run CFG --nproc-per-node 4`` as a user runs it
  (CFG an MMEngine-style config, ``_setup_workload`` its ``custom_imports``;
  every rank a fresh interpreter, as ``torch.distributed.run`` starts the
  hand-written scripts, which can end itself after its first forward):
  ``DDP``; ``FSDP`` (one unit per block: a size-based wrap policy of one
  block's parameters); ``FSDP, no wrap policy`` (``FSDPStrategy``'s default:
  the root the only unit); ``FSDP, load_from`` (the same, with ``load_from`` a
  ``torch.save`` file of the model as a one-device run initialises it, so
  its weights are the other rows'); ``ZeRO-3`` and ``ZeRO-3, load_from``
  (``DeepSpeedStrategy`` with ``zero_optimization=dict(stage=3)``).
* hand-written rows, the same model and batch in plain torch under
  ``python -m torch.distributed.run``: FSDP2 set up as MMEngine's
  FSDPStrategy does (every rank builds and initialises the whole model,
  ``_setup_hand_mmengine.py``) and as Accelerate's
  ``cpu_ram_efficient_loading`` does (rank 0 alone whole, then a broadcast
  per parameter, ``_setup_hand_accelerate.py``); and ZeRO-3 in plain
  DeepSpeed (``_setup_hand_deepspeed.py``), set up as MMEngine's
  DeepSpeedStrategy does (every rank builds and initialises the whole model,
  ``deepspeed.initialize`` partitions it) and as DeepSpeed's tutorials do
  (``zero.Init``, then ``init_weights`` on rank 0 inside
  ``GatheredParameters`` of every parameter): what DeepSpeed itself costs,
  beside which the flexgraph ZeRO-3 rows' time is read.

Each rank records (``_setup_workload.SetupRecord``) its peak resident memory
from process start to the start of the first iteration (in flexgraph's
rows also each setup step's own peak), then the first iteration's loss:
the forward of the loop's first batch, without backward and optimizer step
(four whole-model DDP ranks of the largest size would need about 8 GiB each
for those, and setup is what is measured), and the wall clock at the end of
setup and after that forward; then the rank ends. A row's time to the first
iteration runs from its launch to the moment its last rank ends setup and
would start the first iteration. The first forward is shown apart: under
FSDP and ZeRO-3 it gathers every parameter from the other ranks, the
communication of every iteration, which DDP pays in its backward instead (and
this forward-only iteration has no backward), so counted with setup it
charged the sharded rows with a part of training DDP was spared (FSDP's first
forward took 90 s of its 155 s on a busy machine, DDP's none of its 103 s).

The rows run ``--rounds`` times (default 3), in an order that reverses from
one round to the next, so no row always runs first or after the same
neighbour (the shared timing harness's rounds, ``benchmarks/_harness.py``
once it is on main); memory and time are each row's medians over the
rounds. Printed: each row's peak on rank 0 and on the other ranks (their
largest), both as a ratio to DDP's rank peak (its largest rank), its time to
the first iteration and the ratio to DDP's, its first loss; the per-step
peaks of the ZeRO-3 rows on every rank; then the goals, met or not:

* FSDP, ranks other than 0: peak before the first iteration at most 0.40x
  DDP's rank peak;
* FSDP with ``load_from``: every rank at most 0.40x;
* time to the first iteration of each FSDP and ZeRO-3 row at most 1.1x DDP's
  (medians);
* the first iteration's fp32 loss equal to DDP's, in every row.

Below the goals, each flexgraph ZeRO-3 row's time as a ratio to the faster
hand-written ZeRO-3 row's, where those ran.

``--limit FRACTION`` then runs DDP, the MMEngine-way and Accelerate-way
scripts, FSDP (one unit per block) and ZeRO-3 once more, each
rank in a memory cgroup of its own (``_memory_limit.py``; v1 or v2, written
as root) that lets it hold FRACTION (below 1) of the model's bytes beyond
what it held after its imports: the rows whose ranks hold the model whole are
killed by the kernel, and the report says so; flexgraph's FSDP and ZeRO-3
reach the first iteration. Without writable cgroups it stops with the reason.

Every rank runs one intra-op thread (``OMP_NUM_THREADS=1``). The largest
configuration needs about 1.7 GiB per whole copy of the model: DDP's four
ranks hold about 10 GiB together. Run it on a machine that is not busy
otherwise (``uptime``); ``--size 20M`` is a quick run. Run::

    python benchmarks/setup_memory.py [--size 450M] [--blocks 24] [--nproc 4]
        [--rounds 3] [--rows ddp,fsdp,fsdp-root,fsdp-load,zero3,zero3-load,mmengine,accelerate,
        ds-whole,ds-zero-init]
        [--keep] [--limit 0.9]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _memory_limit as memory_limit
import attrs
from _memory_limit import ALLOWANCE_ENV, NAME_ENV
from _memory_workload import block_parameter_count
from _setup_workload import BATCH, CLASSES, LR, RECORD_NAME, SEED, width_for

HERE = Path(__file__).resolve().parent
MEMORY_GOAL = 0.40
GiB = 1024.0  # MiB per GiB


@attrs.frozen
class Row:
    """One way to set up: a flexgraph strategy (and maybe ``load_from``), or a script."""

    key: str
    label: str
    strategy: dict[str, Any] | None = None
    loads: bool = False
    script: str | None = None
    script_args: tuple[str, ...] = ()


def all_rows(width: int, nproc: int) -> dict[str, Row]:
    policy = dict(type="torch.distributed.fsdp.wrap.size_based_auto_wrap_policy",
                  min_num_params=block_parameter_count(width))
    fsdp = dict(type="FSDPStrategy", model_wrapper=dict(auto_wrap_policy=policy))
    hybrid = dict(sharding_strategy="HYBRID_SHARD", device_mesh=(2, max(nproc // 2, 1)))
    hsdp = dict(type="FSDPStrategy", model_wrapper=dict(auto_wrap_policy=policy, **hybrid))
    zero3 = dict(type="DeepSpeedStrategy", zero_optimization=dict(stage=3))
    rows = [
        Row("ddp", "flexgraph DDP", dict(type="DDPStrategy")),
        Row("fsdp", "flexgraph FSDP", fsdp),
        Row("fsdp-root", "flexgraph FSDP, no wrap policy", dict(type="FSDPStrategy")),
        Row("fsdp-own", "flexgraph FSDP, each rank makes its rows",
            {**fsdp, "type": "fsdp_own_rows"}),
        Row("hsdp", f"flexgraph HSDP {hybrid['device_mesh'][0]}x{hybrid['device_mesh'][1]}",
            hsdp),
        Row("hsdp-root", f"flexgraph HSDP {hybrid['device_mesh'][0]}x"
                         f"{hybrid['device_mesh'][1]}, no wrap policy",
            dict(type="FSDPStrategy", model_wrapper=hybrid)),
        Row("fsdp-load", "flexgraph FSDP, load_from", fsdp, loads=True),
        Row("zero3", "flexgraph ZeRO-3", zero3),
        Row("zero3-load", "flexgraph ZeRO-3, load_from", zero3, loads=True),
        Row("mmengine", "hand FSDP2, every rank whole (MMEngine)",
            script="_setup_hand_mmengine.py"),
        Row("accelerate", "hand FSDP2, rank 0 whole + broadcasts (Accelerate)",
            script="_setup_hand_accelerate.py"),
        Row("ds-whole", "hand ZeRO-3, every rank whole (MMEngine)",
            script="_setup_hand_deepspeed.py", script_args=("--way", "whole")),
        Row("ds-zero-init", "hand ZeRO-3, zero.Init + gathered init (DeepSpeed)",
            script="_setup_hand_deepspeed.py", script_args=("--way", "zero-init")),
    ]
    return {row.key: row for row in rows}


@attrs.frozen
class Outcome:
    """One run of a row: every rank's record, the time to the first iteration and that
    of its first forward, or why not."""

    records: tuple[dict[str, Any], ...] = ()
    seconds: float | None = None
    forward_seconds: float | None = None
    note: str = ""
    killed: tuple[int, ...] = ()


def _env(limit: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **(limit or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


def parse_size(text: str) -> float:
    """``450M`` -> 450e6 parameters (``K``, ``M``, ``G`` or a plain number)."""
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1:].upper())
    return float(text[:-1]) * scale if scale else float(text)


def config_text(row: Row, args: argparse.Namespace, work_dir: Path, weights: Path) -> str:
    cfg = dict(
        custom_imports=dict(imports=["_setup_workload"], allow_failed_imports=False),
        model=dict(type="SetupBenchModel", blocks=args.blocks, width=args.width),
        train_dataloader=dict(batch_size=BATCH, num_workers=0,
                              dataset=dict(type="SetupRows", n=BATCH * args.nproc,
                                           width=args.width, classes=CLASSES, seed=SEED),
                              sampler=dict(type="DefaultSampler", shuffle=False)),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR)),
        train_cfg=dict(by_epoch=False, max_iters=1),
        default_hooks=dict(timer=dict(type="IterTimerHook"),
                           logger=dict(type="LoggerHook", interval=1),
                           param_scheduler=dict(type="ParamSchedulerHook"),
                           checkpoint=None,
                           sampler_seed=dict(type="DistSamplerSeedHook")),
        custom_hooks=[dict(type="SetupRecorder")],
        randomness=dict(seed=SEED),
        strategy=row.strategy,
        work_dir=str(work_dir),
    )
    if row.loads:
        cfg["load_from"] = str(weights)
    return "".join(f"{key} = {value!r}\n" for key, value in cfg.items())


def write_weights(args: argparse.Namespace, path: Path) -> None:
    """The model as a one-device run builds and initialises it (seeded alike), saved."""
    code = ("import sys, torch; from _setup_workload import SetupBenchModel, "
            "seed_like_flexgraph; seed_like_flexgraph(); "
            f"m = SetupBenchModel({args.blocks}, {args.width}); m.init_weights(); "
            f"torch.save({{'state_dict': m.state_dict()}}, sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(path)], env=_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_row(row: Row, args: argparse.Namespace, root: Path, weights: Path,
            round_: int, allowance: int | None = None) -> Outcome:
    """One run of ``row``; with an ``allowance`` (bytes), each rank in its own memory cgroup
    limited to what it holds after its imports plus that (:mod:`_memory_limit`)."""
    if allowance is None:
        return _run(row, args, root / f"{row.key}-{round_}", weights, round_, None)
    name = f"setup-memory-{os.getpid()}-{row.key}"
    prefix = memory_limit.prefix(name)
    try:
        outcome = _run(row, args, root / name, weights, round_,
                       {NAME_ENV: prefix, ALLOWANCE_ENV: str(allowance)})
    finally:
        killed = tuple(r for r in range(args.nproc) if _killed_and_removed(prefix, r))
    return attrs.evolve(outcome, killed=killed)


def _killed_and_removed(prefix: str, rank: int) -> bool:
    """Whether the limit killed the rank; its cgroup removed (once its processes are gone)."""
    if not Path(f"{prefix}-rank{rank}").is_dir():
        return False
    killed = memory_limit.oom_killed(prefix, rank)
    for _ in range(50):
        try:
            memory_limit.remove(prefix, rank)
            break
        except OSError:
            time.sleep(0.1)
    return killed


def _run(row: Row, args: argparse.Namespace, work_dir: Path, weights: Path, round_: int,
         limit: dict[str, str] | None) -> Outcome:
    work_dir.mkdir(parents=True)
    if row.script is None:
        config = work_dir / "cfg.py"
        config.write_text(config_text(row, args, work_dir, weights))
        argv = [sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir",
                str(work_dir), "--nproc-per-node", str(args.nproc)]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(args.nproc), str(HERE / row.script),
                "--blocks", str(args.blocks), "--width", str(args.width),
                "--work-dir", str(work_dir), *row.script_args]
    print(f"  round {round_ + 1}: {row.label} ...", end="", file=sys.stderr, flush=True)
    log = work_dir / "run.log"
    start = time.time()
    with open(log, "w") as out:
        try:
            code = subprocess.run(argv, cwd=work_dir, env=_env(limit), stdout=out,
                                  stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    print(f" {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    paths = [work_dir / RECORD_NAME.format(rank=rank) for rank in range(args.nproc)]
    # every rank ends itself once its record is written (SetupRecorder): flexgraph's
    # launcher says so as ranks that exited before their run finished (status 1), which is
    # what this measurement asks of them; the records decide
    if code is not None and all(p.exists() for p in paths):
        records = tuple(json.loads(p.read_text()) for p in paths)
        ready = max(r["setup_end"] for r in records)
        return Outcome(records, ready - start, max(r["first_iter_end"] for r in records) - ready)
    lines = log.read_text(errors="replace").strip().splitlines()
    print("\n".join(f"    | {line}" for line in lines[-12:]), file=sys.stderr)
    last = next((x.strip() for x in reversed(lines) if x.strip().strip("=-")), "")
    why = "timed out" if code is None else f"exit status {code}"
    return Outcome(note=f"failed ({why}): {last[:100]}")


def round_order(names: list[str], round_: int) -> list[str]:
    """The rows in the order of round ``round_``: reversed every other round."""
    return list(names) if round_ % 2 == 0 else list(reversed(names))


@attrs.frozen
class Summary:
    """A row's medians over its rounds (``None`` where a run failed)."""

    row: Row
    rank0_mib: float | None
    others_mib: float | None
    seconds: float | None
    forward_seconds: float | None
    losses: tuple[float, ...]
    step_peaks: tuple[dict[str, float], ...]
    note: str = ""


def summarise(row: Row, outcomes: list[Outcome]) -> Summary:
    done = [o for o in outcomes if o.records]
    if not done:
        return Summary(row, None, None, None, None, (), (),
                       outcomes[0].note if outcomes else "")
    rank0 = statistics.median(o.records[0]["setup_peak_mib"] for o in done)
    others = statistics.median(max(r["setup_peak_mib"] for r in o.records[1:]) for o in done)
    seconds = statistics.median(o.seconds for o in done)
    forward = statistics.median(o.forward_seconds for o in done)
    losses = tuple(r["first_loss"] for r in done[0].records)
    steps = tuple(r.get("step_peaks_mib", {}) for r in done[0].records)
    note = "" if len(done) == len(outcomes) else f"{len(outcomes) - len(done)} runs failed"
    return Summary(row, rank0, others, seconds, forward, losses, steps, note)


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / GiB:.2f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def report(summaries: list[Summary], args: argparse.Namespace) -> list[str]:
    by_key = {s.row.key: s for s in summaries}
    ddp = by_key.get("ddp")
    ddp_peak = max(ddp.rank0_mib, ddp.others_mib) if ddp and ddp.rank0_mib else None
    ddp_time = ddp.seconds if ddp else None
    lines = [
        f"{args.params / 1e6:.0f} M parameters ({args.blocks} blocks of width {args.width}), "
        f"{args.nproc} CPU processes (gloo), fp32; medians of {args.rounds} rounds",
        f"peaks: resident memory from process start to the first iteration, GiB; "
        f"x DDP: to DDP's rank peak ({_gib(ddp_peak)} GiB)",
        "",
        f"{'row':<52} {'rank 0':>7} {'others':>7} {'x DDP':>11} {'to 1st s':>8} "
        f"{'x DDP':>6} {'fwd s':>6}  first loss (rank 0)",
    ]
    for s in summaries:
        if s.rank0_mib is None:
            lines.append(f"{s.row.label:<52} {s.note}")
            continue
        ratios = f"{_ratio(s.rank0_mib, ddp_peak)}/{_ratio(s.others_mib, ddp_peak)}"
        lines.append(f"{s.row.label:<52} {_gib(s.rank0_mib):>7} {_gib(s.others_mib):>7} "
                     f"{ratios:>11} {s.seconds:>8.1f} {_ratio(s.seconds, ddp_time):>6} "
                     f"{s.forward_seconds:>6.1f}  {s.losses[0]!r}"
                     + (f"  ({s.note})" if s.note else ""))
    for s in summaries:
        if s.row.key.startswith("zero3") and s.step_peaks:
            lines += ["", f"{s.row.label}: each setup step's peak, GiB (rank 0, 1, ...)"]
            names = [n for n in s.step_peaks[0] if n not in ("train",)]
            for name in names:
                peaks = " ".join(f"{_gib(p.get(name)):>6}" for p in s.step_peaks)
                lines.append(f"  {name:<24} {peaks}")
    lines += ["", *goals(by_key, ddp_peak, ddp_time), *against_deepspeed(by_key)]
    return lines


def against_deepspeed(by_key: dict[str, Summary]) -> list[str]:
    """Each flexgraph ZeRO-3 row's time against the faster hand-written DeepSpeed row's:
    how far flexgraph's ZeRO-3 setup is from what DeepSpeed itself costs."""
    hands = [by_key[k] for k in ("ds-whole", "ds-zero-init")
             if k in by_key and by_key[k].seconds is not None]
    if not hands:
        return []
    hand = min(hands, key=lambda s: s.seconds)
    return [f"{s.row.label} against {hand.row.label}: {s.seconds / hand.seconds:.2f}x"
            for s in (by_key.get(k) for k in ("zero3", "zero3-load"))
            if s is not None and s.seconds is not None]


RANDOM_SHARDED = ("fsdp", "fsdp-root", "hsdp", "hsdp-root")
"""The FSDP and HSDP rows whose weights come from random init."""
INIT_STEPS = ("before build_model", "setup_env", "build_model", "init_weights")
"""The setup steps through ``init_weights``, whose peaks ZeRO-3's memory goal reads."""
TIME_GOALS = {"fsdp": 0.63, "fsdp-root": 0.63, "zero3": 1.14}
"""Time to the first iteration, at most this times DDP's (FSDP's and ZeRO-3's before the
random init was made without a whole model)."""


def _verdict(ok: bool | None, culprits: list[str] = ()) -> str:
    found = "not measured" if ok is None else ("met" if ok else "not met")
    return found + (f" (over: {', '.join(culprits)})" if culprits else "")


def _through_init(summary: Summary) -> float | None:
    """The largest peak of any rank in the steps up to and including ``init_weights``."""
    peaks = [p[name] for p in summary.step_peaks for name in INIT_STEPS if name in p]
    return max(peaks) if peaks else None


def goals(by_key: dict[str, Summary], ddp_peak: float | None,
          ddp_time: float | None) -> list[str]:
    limit = None if ddp_peak is None else MEMORY_GOAL * ddp_peak
    random = [by_key[k] for k in RANDOM_SHARDED if k in by_key and by_key[k].rank0_mib]
    over = [s.row.label for s in random if limit and max(s.rank0_mib, s.others_mib) > limit]
    sharded = None if limit is None or not random else not over
    loaded = by_key.get("fsdp-load")
    every = None if limit is None or not loaded or loaded.rank0_mib is None else \
        max(loaded.rank0_mib, loaded.others_mib) <= limit
    zero3 = by_key.get("zero3")
    through = None if zero3 is None else _through_init(zero3)
    partitions = None if limit is None or through is None else through <= limit
    timed = [(by_key[k], bound) for k, bound in TIME_GOALS.items()
             if k in by_key and by_key[k].seconds is not None]
    slow = [f"{s.row.label} {s.seconds / ddp_time:.2f}x > {bound:.2f}x" for s, bound in timed
            if ddp_time and s.seconds > bound * ddp_time]
    fast = None if not timed or not ddp_time else not slow
    ddp = by_key.get("ddp")
    measured = [s for s in by_key.values() if s.losses]
    same = None if not ddp or not ddp.losses else all(
        s.losses == ddp.losses for s in measured)
    differing = [s.row.label for s in measured if ddp and ddp.losses and s.losses != ddp.losses]
    return [
        f"goal: FSDP and HSDP from random init, with and without a wrap policy, every rank "
        f"<= {MEMORY_GOAL:.2f}x DDP's rank peak: {_verdict(sharded, over)}",
        f"goal: FSDP with load_from, every rank <= {MEMORY_GOAL:.2f}x DDP's rank peak: "
        f"{_verdict(every)}",
        f"goal: ZeRO-3 from random init, every rank through init_weights <= "
        f"{MEMORY_GOAL:.2f}x DDP's rank peak: {_verdict(partitions)}",
        "goal: time to the first iteration, FSDP <= "
        f"{TIME_GOALS['fsdp']:.2f}x DDP's, ZeRO-3 <= {TIME_GOALS['zero3']:.2f}x: "
        f"{_verdict(fast, slow)}",
        "goal: first iteration's fp32 loss equal to DDP's on every rank, in every row: "
        f"{_verdict(same, differing)}",
    ]


LIMIT_THROUGH = ("fsdp", "zero3")
"""Under ``--limit``: the rows that must reach the first iteration (without a wrap policy,
FSDP's forward gathers the root unit, the whole model, on every rank)."""
LIMIT_KILLED = ("ddp", "mmengine", "accelerate")
"""Under ``--limit``: the rows whose ranks hold the model whole, which the limit must kill."""


def limited_report(rows: dict[str, Row], outcomes: dict[str, Outcome], allowance: int,
                   model_bytes: int) -> list[str]:
    """What each row did under the limit, and the goal."""
    lines = [f"under a memory limit per rank: its resident memory after imports + "
             f"{allowance / 2**30:.2f} GiB ({allowance / model_bytes:.2f}x the model's "
             f"{model_bytes / 2**30:.2f} GiB), each rank in its own memory cgroup"]
    through, killed = [], []
    for key, outcome in outcomes.items():
        if outcome.records:
            peak = max(r["setup_peak_mib"] for r in outcome.records)
            what = f"reached the first iteration (largest rank peak {_gib(peak)} GiB)"
            through.append(key)
        elif outcome.killed:
            what = f"killed by the limit (rank {', '.join(map(str, outcome.killed))})"
            killed.append(key)
        else:
            what = outcome.note
        lines.append(f"  {rows[key].label:<52} {what}")
    asked = [k for k in (*LIMIT_THROUGH, *LIMIT_KILLED) if k in outcomes]
    wrong = [rows[k].label for k in asked
             if k not in (through if k in LIMIT_THROUGH else killed)]
    lines.append("goal: under the limit, flexgraph FSDP and ZeRO-3 reach the first iteration, "
                 "DDP and the MMEngine-way and Accelerate-way scripts are killed: "
                 + _verdict(not wrong if asked else None, wrong))
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="450M", help="parameters, e.g. 450M (default) or 20M")
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default=None, help="comma-separated row keys (default: all)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--keep", action="store_true", help="keep the work dirs (printed)")
    parser.add_argument("--limit", type=float, default=None, metavar="FRACTION",
                        help="then run the rows of LIMIT_THROUGH and LIMIT_KILLED (those "
                             "--rows names) once more, each rank limited to its memory after "
                             "imports plus FRACTION (< 1) of the model's bytes")
    args = parser.parse_args(argv)
    args.width = width_for(parse_size(args.size), args.blocks)
    from _memory_workload import parameter_count

    args.params = parameter_count(args.blocks, args.width, CLASSES)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = all_rows(args.width, args.nproc)
    keys = args.rows.split(",") if args.rows else list(rows)
    unknown = [k for k in keys if k not in rows]
    why = None if args.limit is None else memory_limit.why_not()
    if why:
        print(f"--limit: {why}", file=sys.stderr)
        return 2
    if unknown:
        print(f"unknown rows {unknown}; the rows are {', '.join(rows)}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="setupbench-"))
    weights = root / "weights.pth"
    try:
        if any(rows[k].loads for k in keys):
            write_weights(args, weights)
        outcomes: dict[str, list[Outcome]] = {k: [] for k in keys}
        for round_ in range(args.rounds):
            for key in round_order(keys, round_):
                outcomes[key].append(run_row(rows[key], args, root, weights, round_))
        summaries = [summarise(rows[k], outcomes[k]) for k in keys if outcomes[k]]
        lines = report(summaries, args) if args.rounds else []
        if args.limit is not None:
            allowance = int(args.limit * args.params * 4)
            limited = {k: run_row(rows[k], args, root, weights, 0, allowance)
                       for k in (*LIMIT_KILLED, *LIMIT_THROUGH) if k in keys}
            lines += ["", *limited_report(rows, limited, allowance, args.params * 4)]
        print("\n".join(lines))
    finally:
        if args.keep:
            print(f"work dirs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
