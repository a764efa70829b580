"""Peak memory per rank under each strategy, and flexgraph's speed against hand-written scripts.

One model, one batch size, 2 ranks, fp32, torch's AdamW. The model is a
264 M-parameter residual MLP of 20 blocks (``_memory_workload.py``). Each row
runs in fresh processes, one row after another, because two ranks under DDP
need about 11 GiB together:

* **flexgraph rows**: ``flexgraph run CFG --nproc-per-node 2``, the way users
  run it. CFG is an MMEngine-style config (``MemoryBenchModel``, a
  ``BaseModel``; ``SyntheticRows``; ``optim_wrapper`` with AdamW; the default
  hooks without checkpoints; an iteration-based loop), with the row's
  strategy dict in it: ``ddp``; ``fsdp`` wrapping each block
  (``model_wrapper.auto_wrap_policy``, size-based); ``deepspeed`` with
  ``zero_optimization=dict(stage=K)`` and no bucket sizes, so that
  flexgraph's own defaults apply. A strategy that is not registered gives a
  row that says so.
* **hand-written rows**: the same model and data in plain torch, launched with
  ``python -m torch.distributed.run --nproc-per-node 2 --standalone``: DDP
  (``_memory_hand_ddp.py``), FSDP2 with meta-device init (``fully_shard`` per
  block, then the root; ``to_empty``, then init; ``_memory_hand_fsdp.py``),
  and ``deepspeed.initialize`` (``zero.Init`` for stage 3;
  ``_memory_hand_deepspeed.py``) on the DeepSpeed config that flexgraph's run
  of the same stage wrote to ``work_dir/deepspeed_config.json``. When
  flexgraph has no DeepSpeed row, the hand-written row runs on DeepSpeed's
  defaults (only the stage set), and it says so. ``--hand-zero-options``
  adds ``zero_optimization`` keys to the hand-written DeepSpeed rows only,
  to preview other settings.

Memory: every rank records its peak from process start through iteration 5:
on the CPU the peak resident set size of the rank process (``ru_maxrss``), on
a GPU ``torch.cuda.max_memory_allocated``. The table gives both ranks, and
the ratio of the larger to DDP's larger (flexgraph rows to flexgraph's DDP,
hand-written rows to the hand-written DDP), with the goals: FSDP at most 0.5x
DDP; ZeRO-3 < ZeRO-1 < DDP, ZeRO-2 not above ZeRO-1, ZeRO-3 at most 0.65x.

Time: every rank stamps the end of each iteration with the same code on both
sides (``RankRecorder``; in flexgraph from an ``after_train_iter`` hook), so
a period is a whole iteration, in wall time and in the rank process's CPU
time (which other load on a shared machine disturbs much less). The first
``--warmup`` iterations are not timed; a row's time per iteration is the
median period of its slower rank. flexgraph's throughput is divided by the
hand-written script's (goal: at least 0.97 for FSDP and DeepSpeed; DDP is a
sanity row).

Every rank runs one intra-op thread (``OMP_NUM_THREADS=1``, in every row).
On the CPU a rank's RSS also holds what the C allocator keeps after tensors
are freed: glibc raises its mmap threshold up to 32 MiB as large blocks are
freed, after which freed tensors below that size stay resident (the blocks'
26 MB weights, gathered and freed again by FSDP and ZeRO-3, are such
tensors). flexgraph fixes the threshold on CPU runs (4 MiB,
``env_cfg.malloc_mmap_threshold``), which gives that memory back at the price
of page faults when it is used again. Every row of this benchmark runs with
the same threshold (``--malloc-mmap-threshold BYTES``, default flexgraph's;
``0`` leaves glibc's adaptive one, in flexgraph's rows too), so the two sides
of a comparison differ only in who wrote the training code. Run::

    python benchmarks/memory.py [--strategies ddp,fsdp,zero1,zero2,zero3]
        [--iters 8] [--warmup 2] [--blocks 20 --width 1280] [--keep]
        [--hand-zero-options JSON] [--malloc-mmap-threshold BYTES] [--estimate]

``--estimate`` checks ``flexgraph plan --estimate`` instead: each flexgraph
row runs once more, untimed, its ranks counting live tensor bytes (a dispatch
mode entered when the config is loaded, before any tensor exists; every
storage an operator makes, C++ ones such as DDP's buckets included, until it
is freed), and the table puts the estimate of the same config for 2 ranks next
to the larger rank's peak of live bytes from the end of iteration 1 through
iteration 5 (the steady state the estimate describes; AdamW's states exist
from the first step on), with their ratio (goal: within 10%) and the peak RSS
beside them. Its rows are the five above and DeepSpeed's three stages in bf16
(``zero1-bf16``, ``zero2-bf16``, ``zero3-bf16``: ``bf16=dict(enabled=True)``;
DeepSpeed refuses fp16 on the CPU).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
from _memory_workload import (
    BATCH,
    BLOCKS,
    CLASSES,
    LIVE_BYTES_VAR,
    LR,
    MEMORY_AFTER_ITERS,
    RECORD_NAME,
    SEED,
    WEIGHT_DECAY,
    WIDTH,
    block_parameter_count,
    parameter_count,
)

from flexgraph.core.strategy import known_strategies
from flexgraph.training.runtime import DEFAULT_MMAP_THRESHOLD

HERE = Path(__file__).resolve().parent
NPROC = 2
KEYS = ("ddp", "fsdp", "zero1", "zero2", "zero3")
# DeepSpeed in bf16 (fp16 is refused on the CPU): --estimate's rows only; the timed
# comparison and its goals are fp32, as the hand-written scripts are.
HALF_KEYS = ("zero1-bf16", "zero2-bf16", "zero3-bf16")
DEEPSPEED_CONFIG = "deepspeed_config.json"  # what flexgraph's DeepSpeed run writes, rank 0
THREADS = "1"  # OMP_NUM_THREADS of every rank, in every row
THROUGHPUT_GOAL = 0.97


# -- rows ---------------------------------------------------------------------------------


@attrs.frozen
class Row:
    """One strategy: its flexgraph strategy dict and its hand-written script."""

    key: str
    label: str
    strategy: dict[str, Any]
    hand_script: str
    hand_label: str


def rows(width: int) -> dict[str, Row]:
    def zero(stage: int) -> Row:
        return Row(f"zero{stage}", f"deepspeed ZeRO-{stage}",
                   dict(type="deepspeed", zero_optimization=dict(stage=stage)),
                   "_memory_hand_deepspeed.py", f"deepspeed.initialize ZeRO-{stage}")

    # MMEngine's spelling of a size-based policy; the threshold is one block, so
    # each block is its own unit (its linears alone stay below it).
    policy = dict(type="torch.distributed.fsdp.wrap.size_based_auto_wrap_policy",
                  min_num_params=block_parameter_count(width))
    return {
        "ddp": Row("ddp", "ddp", dict(type="ddp"), "_memory_hand_ddp.py", "DDP"),
        "fsdp": Row("fsdp", "fsdp", dict(type="fsdp", model_wrapper=dict(auto_wrap_policy=policy)),
                    "_memory_hand_fsdp.py", "fully_shard (FSDP2)"),
        **{f"zero{k}": zero(k) for k in (1, 2, 3)},
        **{f"zero{k}-bf16": attrs.evolve(
            zero(k), key=f"zero{k}-bf16", label=f"deepspeed ZeRO-{k} bf16",
            strategy=dict(zero(k).strategy, bf16=dict(enabled=True))) for k in (1, 2, 3)},
    }


@attrs.frozen
class Result:
    """A row's outcome: the rank records, or why there are none (``note``)."""

    label: str
    records: tuple[dict[str, Any], ...] = ()
    note: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.records)

    @property
    def peaks(self) -> list[float]:
        return [r["peak_mib"] for r in self.records]

    def seconds_per_iter(self, warmup: int, clock: str = "stamps") -> float:
        """The median iteration period after ``warmup`` iterations, of the slower rank;
        ``clock`` is ``'stamps'`` (wall time) or ``'cpu_stamps'`` (process CPU time)."""
        def median_period(stamps: list[float]) -> float:
            return statistics.median(b - a for a, b in zip(stamps[warmup - 1:],
                                                           stamps[warmup:], strict=False))
        return max(median_period(r[clock]) for r in self.records)


def unavailable(strategy: str) -> str | None:
    """Why flexgraph cannot run ``strategy`` here, or ``None`` when it can."""
    if strategy not in known_strategies():
        return f"not available: no strategy {strategy!r} registered"
    return None


# -- running ------------------------------------------------------------------------------


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=THREADS)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if args.malloc_mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    # The config's custom_imports and the hand-written scripts find the workload here.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


def _run(label: str, argv: list[str], work_dir: Path, args: argparse.Namespace,
         extra_env: dict[str, str] | None = None) -> Result:
    """Run one row's processes; collect each rank's record from ``work_dir``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    log = work_dir / "run.log"
    print(f"  {label} ...", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        try:
            code = subprocess.run(argv, cwd=work_dir, env={**_env(args), **(extra_env or {})},
                                  stdout=out,
                                  stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    print(f" {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    paths = [work_dir / RECORD_NAME.format(rank=rank) for rank in range(NPROC)]
    if code == 0 and all(p.exists() for p in paths):
        return Result(label, tuple(json.loads(p.read_text()) for p in paths))
    lines = log.read_text(errors="replace").strip().splitlines()
    print("\n".join(f"    | {line}" for line in lines[-12:]), file=sys.stderr)
    why = f"timed out after {args.timeout:.0f} s" if code is None else (
        f"exit status {code}" if code else "no rank records")
    last = next((line.strip() for line in reversed(lines)  # not torchrun's ===== rule
                 if line.strip().strip("=-")), "")
    return Result(label, note=f"failed ({why}): {last[:100]}")


def flexgraph_config(row: Row, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """The MMEngine-style config of a flexgraph row, as a user would write it."""
    iters = total_iters(args)
    return dict(
        custom_imports=dict(imports=["_memory_mmengine"], allow_failed_imports=False),
        model=dict(type="MemoryBenchModel", blocks=args.blocks, width=args.width,
                   classes=CLASSES),
        train_dataloader=dict(batch_size=BATCH, num_workers=0,
                              dataset=dict(type="SyntheticRows", n=iters * BATCH * NPROC,
                                           width=args.width, classes=CLASSES),
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        # No type: MMEngine's default OptimWrapper, which every strategy accepts.
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR, weight_decay=WEIGHT_DECAY)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        # MMEngine's default hooks, minus checkpoints (a 3 GiB write per row that
        # happens after the measured iterations anyway).
        default_hooks=dict(timer=dict(type="IterTimerHook"),
                           logger=dict(type="LoggerHook", interval=10),
                           param_scheduler=dict(type="ParamSchedulerHook"),
                           checkpoint=None,
                           sampler_seed=dict(type="DistSamplerSeedHook")),
        custom_hooks=[dict(type="MemoryBenchRecorder")],
        randomness=dict(seed=SEED),
        env_cfg=dict(malloc_mmap_threshold=args.malloc_mmap_threshold),
        strategy=row.strategy,
        work_dir=str(work_dir),
    )


def run_flexgraph(row: Row, args: argparse.Namespace, root: Path,
                  live_bytes: bool = False) -> Result:
    """A flexgraph row; with ``live_bytes``, its ranks count live tensor bytes (untimed)."""
    label = f"flexgraph {row.label}"
    why = unavailable(row.strategy["type"])
    if why:
        return Result(label, note=why)
    work_dir = root / f"flexgraph-{row.key}"
    config = config_path(row, root)
    cfg = flexgraph_config(row, args, work_dir)
    config.write_text("".join(f"{key} = {value!r}\n" for key, value in cfg.items()))
    argv = [sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir", str(work_dir),
            "--nproc-per-node", str(NPROC)]
    return _run(label, argv, work_dir, args, extra_env={LIVE_BYTES_VAR: "1"} if live_bytes
                else None)


def config_path(row: Row, root: Path) -> Path:
    return root / f"{row.key}_cfg.py"


def estimate_of(row: Row, args: argparse.Namespace, root: Path) -> dict[str, Any] | None:
    """``flexgraph plan CFG --estimate --world-size 2 --format json``'s candidate row.

    No ``--device-memory``: the estimate is then for the device this benchmark
    runs on (a GPU's kernels where CUDA is present, else the CPU's), whose
    optimizer step allocates what that device's kernels do."""
    argv = [sys.executable, "-m", "flexgraph", "plan", str(config_path(row, root)),
            "--estimate", "--world-size", str(NPROC), "--format", "json"]
    done = subprocess.run(argv, env=_env(args), capture_output=True, text=True)
    if done.returncode:
        print(f"  estimate of {row.key} failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout)["candidates"][0]


def hand_deepspeed_config(stage: int, flexgraph_dir: Path | None,
                          extra: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The config of a hand-written DeepSpeed row, and where it came from.

    flexgraph's own (``deepspeed_config.json`` of its run of the same stage) when
    there is one, else DeepSpeed's defaults with only the stage set; keys the
    hand-written script sets itself (its optimizer) are dropped; ``extra`` is
    laid over ``zero_optimization``.
    """
    written = flexgraph_dir / DEEPSPEED_CONFIG if flexgraph_dir else None
    if written is not None and written.exists():
        config, source = json.loads(written.read_text()), "flexgraph's config"
    else:
        config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": stage}}
        source = "DeepSpeed's defaults"
    for key in ("optimizer", "scheduler"):  # the script passes torch's AdamW itself
        config.pop(key, None)
    if extra:
        config["zero_optimization"] = {**config.get("zero_optimization", {}), **extra}
        source += " + --hand-zero-options"
    return config, source


def run_hand(row: Row, args: argparse.Namespace, root: Path,
             flexgraph_result: Result) -> Result:
    label = f"hand {row.hand_label}"
    work_dir = root / f"hand-{row.key}"
    work_dir.mkdir(parents=True, exist_ok=True)
    extra: list[str] = []
    if row.key.startswith("zero"):
        flexgraph_dir = root / f"flexgraph-{row.key}" if flexgraph_result.ok else None
        if flexgraph_dir and not (flexgraph_dir / DEEPSPEED_CONFIG).exists():
            return Result(label, note=f"not run: flexgraph's run wrote no {DEEPSPEED_CONFIG}")
        config, source = hand_deepspeed_config(int(row.key[-1]), flexgraph_dir,
                                               args.hand_zero_options)
        path = work_dir / "ds_config.json"
        path.write_text(json.dumps(config, indent=2))
        extra = ["--ds-config", str(path)]
        label += f" ({source})"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC),
            "--standalone", str(HERE / row.hand_script), "--blocks", str(args.blocks),
            "--width", str(args.width), "--iters", str(total_iters(args)),
            "--work-dir", str(work_dir), *extra]
    return _run(label, argv, work_dir, args)


def total_iters(args: argparse.Namespace) -> int:
    return max(MEMORY_AFTER_ITERS, args.warmup + args.iters)


# -- the report ---------------------------------------------------------------------------


def _ratio(result: Result, baseline: Result | None) -> float | None:
    if not result.ok or baseline is None or not baseline.ok:
        return None
    return max(result.peaks) / max(baseline.peaks)


def memory_table(results: list[tuple[Result, Result | None]]) -> list[str]:
    """One line per row: both ranks' peaks and the ratio to its DDP baseline."""
    width = max(len(result.label) for result, _ in results)
    lines = [f"  {'row':<{width}} {'rank 0 MiB':>10} {'rank 1 MiB':>10} {'/ DDP':>6}"]
    for result, baseline in results:
        if not result.ok:
            lines.append(f"  {result.label:<{width}} {result.note}")
            continue
        ratio = _ratio(result, baseline)
        shown = "n/a" if ratio is None else f"{ratio:.2f}"
        lines.append(f"  {result.label:<{width}} {result.peaks[0]:10.0f} {result.peaks[1]:10.0f} "
                     f"{shown:>6}")
    return lines


Check = Callable[[dict[str, Result]], tuple[bool, str] | None]


def _peak(results: dict[str, Result], key: str) -> float | None:
    result = results.get(key)
    return max(result.peaks) if result is not None and result.ok else None


def _at_most(key: str, limit: float) -> Check:
    def check(results: dict[str, Result]) -> tuple[bool, str] | None:
        peak, ddp = _peak(results, key), _peak(results, "ddp")
        if peak is None or ddp is None:
            return None
        return peak / ddp <= limit, f"{peak / ddp:.2f}x"
    return check


def _below(key: str, other: str, *, strict: bool) -> Check:
    def check(results: dict[str, Result]) -> tuple[bool, str] | None:
        peak, limit = _peak(results, key), _peak(results, other)
        if peak is None or limit is None:
            return None
        return (peak < limit if strict else peak <= limit), f"{peak:.0f} vs {limit:.0f} MiB"
    return check


GOALS: tuple[tuple[str, Check], ...] = (
    ("FSDP <= 0.5x DDP", _at_most("fsdp", 0.5)),
    ("ZeRO-1 < DDP", _below("zero1", "ddp", strict=True)),
    ("ZeRO-3 < ZeRO-1", _below("zero3", "zero1", strict=True)),
    ("ZeRO-2 <= ZeRO-1", _below("zero2", "zero1", strict=False)),
    ("ZeRO-3 <= 0.65x DDP", _at_most("zero3", 0.65)),
)


def _verdict(outcome: tuple[bool, str] | None) -> str:
    if outcome is None:
        return "n/a (a row is missing)"
    met, figure = outcome
    return f"{'met' if met else 'NOT MET'} ({figure})"


def goals_table(flexgraph: dict[str, Result], hand: dict[str, Result]) -> list[str]:
    lines = [f"  {'goal':<22} {'flexgraph':<30} hand-written (preview)"]
    for name, check in GOALS:
        lines.append(f"  {name:<22} {_verdict(check(flexgraph)):<30} {_verdict(check(hand))}")
    return lines


def time_table(keys: list[str], flexgraph: dict[str, Result], hand: dict[str, Result],
               warmup: int) -> list[str]:
    """Per strategy and clock: flexgraph's and the hand-written s/iter, and the ratio of
    their throughputs (hand s/iter over flexgraph s/iter)."""
    lines = [f"  {'strategy':<8} {'clock':<5} {'flexgraph s/iter':>16} {'hand s/iter':>12} "
             f"{'flexgraph/hand throughput':>26}  goal"]
    for key in keys:
        mine, theirs = flexgraph[key], hand[key]
        comparable = "--hand-zero-options" not in theirs.label
        for clock, name in (("stamps", "wall"), ("cpu_stamps", "CPU")):
            t_mine = mine.seconds_per_iter(warmup, clock) if mine.ok else None
            t_hand = theirs.seconds_per_iter(warmup, clock) if theirs.ok else None
            ratio = t_hand / t_mine if t_mine and t_hand and comparable else None
            if key == "ddp":
                goal = "(sanity row)"
            elif ratio is None:
                goal = f">= {THROUGHPUT_GOAL}: n/a"
            else:
                goal = f">= {THROUGHPUT_GOAL}: {'met' if ratio >= THROUGHPUT_GOAL else 'NOT MET'}"
            shown = "n/a" if ratio is None else f"{ratio:.3f}"
            lines.append(f"  {key:<8} {name:<5} {_seconds(t_mine):>16} {_seconds(t_hand):>12} "
                         f"{shown:>26}  {goal}")
    return lines


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _consistency(results: list[Result]) -> list[str]:
    """What every row must share for the comparison to hold; a line per violation."""
    problems = []
    for name in ("threads", "memory_kind", "device"):
        seen = {r.label: {rec[name] for rec in r.records} for r in results if r.ok}
        values = set().union(*seen.values()) if seen else set()
        if len(values) > 1:
            problems.append(f"warning: rows differ in {name}: {seen}")
    return problems


# -- main ---------------------------------------------------------------------------------


def _keys(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in KEYS + HALF_KEYS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown strategies {unknown}; choose from {','.join(KEYS + HALF_KEYS)}")
    return keys


def _zero_options(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object of zero_optimization keys")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", type=_keys, default=None,
                        help=f"comma-separated rows, from {','.join(KEYS)} (default: all), "
                        f"and with --estimate also {','.join(HALF_KEYS)} (default: all)")
    parser.add_argument("--iters", type=int, default=8, help="timed iterations per row")
    parser.add_argument("--warmup", type=int, default=2,
                        help="iterations before the timed ones (at least 1)")
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--hand-zero-options", type=_zero_options, default={},
                        metavar="JSON", help="zero_optimization keys added to the "
                        "hand-written DeepSpeed rows only (their throughput is then not "
                        "compared with flexgraph's)")
    parser.add_argument("--malloc-mmap-threshold", type=int, default=DEFAULT_MMAP_THRESHOLD,
                        metavar="BYTES",
                        help="glibc's mmap threshold in every rank of every row (default: "
                        "flexgraph's, %(default)s; 0: glibc's adaptive one, which raises it "
                        "to 32 MiB as freed blocks come back, so that freed tensors below "
                        "that size stay resident)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--estimate", action="store_true",
                        help="compare flexgraph plan --estimate with each flexgraph row's "
                        "live tensor bytes (untimed runs; no hand-written rows)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work dirs (configs, logs, rank records)")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.iters < 1:
        parser.error("--warmup and --iters must be at least 1")
    return args


def estimate_table(keys: list[str], args: argparse.Namespace) -> list[str]:
    """Each flexgraph row run with its live tensor bytes counted, next to its estimate."""
    table = rows(args.width)
    root = Path(tempfile.mkdtemp(prefix="membench-estimate-"))
    lines = [f"  {'row':<10} {'estimate MiB':>12} {'live peak MiB':>13} {'estimate/live':>13} "
             f"{'peak RSS MiB':>12}  estimate's phase"]
    try:
        for key in keys:
            result = run_flexgraph(table[key], args, root, live_bytes=True)
            estimate = estimate_of(table[key], args, root) if result.ok else None
            if not result.ok or estimate is None:
                lines.append(f"  {key:<10} {result.note or 'estimate failed'}")
                continue
            live = max(r["live_peak_mib"] for r in result.records)
            guess = estimate["peak_bytes"] / 2**20
            lines.append(f"  {key:<10} {guess:12.0f} {live:13.0f} {guess / live:13.3f} "
                         f"{max(result.peaks):12.0f}  {estimate['phase']}")
    finally:
        if args.keep:
            print(f"work dirs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.estimate:
        keys = [k for k in KEYS + HALF_KEYS if k in (args.strategies or KEYS + HALF_KEYS)]
        params = parameter_count(args.blocks, args.width)
        print(f"estimate against live tensor bytes: {args.blocks} residual blocks of width "
              f"{args.width} ({params / 1e6:.1f} M parameters), fp32 (the -bf16 rows: "
              f"DeepSpeed's bf16), AdamW, batch {BATCH} "
              f"per rank, {NPROC} ranks on the CPU; live peak: the larger rank's, end of "
              f"iteration 1 through iteration {MEMORY_AFTER_ITERS}")
        print("\n".join(estimate_table(keys, args)))
        return
    if torch.cuda.is_available() and torch.cuda.device_count() < NPROC:
        sys.exit(f"error: CUDA is available with {torch.cuda.device_count()} device(s) but "
                 f"each of the {NPROC} ranks needs its own; hide the GPU "
                 f"(CUDA_VISIBLE_DEVICES=) to measure on the CPU")
    if set(args.strategies or ()) & set(HALF_KEYS):
        sys.exit(f"error: {','.join(HALF_KEYS)} are rows of --estimate only")
    keys = [k for k in KEYS if k in (args.strategies or KEYS)]
    table = rows(args.width)
    root = Path(tempfile.mkdtemp(prefix="membench-"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    params = parameter_count(args.blocks, args.width)
    print(f"running {len(keys)} strategies x (flexgraph, hand-written) in {root}",
          file=sys.stderr)
    flexgraph: dict[str, Result] = {}
    hand: dict[str, Result] = {}
    try:
        for key in keys:
            flexgraph[key] = run_flexgraph(table[key], args, root)
            hand[key] = run_hand(table[key], args, root, flexgraph[key])
    finally:
        if args.keep:
            print(f"work dirs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    ran = [r for r in (*flexgraph.values(), *hand.values()) if r.ok]
    kind = ran[0].records[0]["memory_kind"] if ran else "n/a"
    threads = sorted({rec["threads"] for r in ran for rec in r.records})
    print(f"memory benchmark: {args.blocks} residual blocks of width {args.width} "
          f"({params / 1e6:.1f} M parameters, {params * 4 / 2**20:.0f} MiB in fp32), fp32, "
          f"AdamW, batch {BATCH} per rank, {NPROC} ranks on {device}, "
          f"{threads or '?'} thread(s) per rank (OMP_NUM_THREADS={THREADS}) in every row; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.malloc_mmap_threshold:
        print(f"every rank of every row returns freed blocks of "
              f"{args.malloc_mmap_threshold} bytes and more to the system (glibc's mmap "
              f"threshold; flexgraph's default on the CPU)")
    else:
        print("every rank of every row runs with glibc's adaptive mmap threshold")
    print(f"\npeak memory per rank, process start through iteration {MEMORY_AFTER_ITERS} "
          f"({kind}); flexgraph rows / flexgraph ddp, hand-written rows / hand DDP")
    ddp_flex, ddp_hand = flexgraph.get("ddp"), hand.get("ddp")
    pairs = [(flexgraph[k], ddp_flex) for k in keys] + [(hand[k], ddp_hand) for k in keys]
    print("\n".join(memory_table(pairs)))
    print("\ngoals (max over ranks)")
    print("\n".join(goals_table(flexgraph, hand)))
    print(f"\ntime per iteration: median of iterations {args.warmup + 1}-{total_iters(args)}, "
          f"slower rank; wall time, and the rank process's CPU time (less disturbed by "
          f"other load)")
    print("\n".join(time_table(keys, flexgraph, hand, args.warmup)))
    for line in _consistency(ran):
        print(line)


if __name__ == "__main__":
    main()
