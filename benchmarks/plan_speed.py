"""How long planning takes, next to the cost of ``import flexgraph`` itself.

Planning runs on every ``flexgraph plan`` and before every ``flexgraph run``, so
it should never be what a user waits for: the goal is that planning a graph of
1,000 steps under a strategy of 20 rewrites costs less than importing flexgraph
(measured in fresh interpreters, in the same interleaved rounds as the plans:
``_harness.py``; medians).

The generated graphs are made of groups of five steps, shaped like a training
graph: one producer, two in-place updaters (a chain), two consumers. The
strategy mixes 8 moves, 6 inserts, 4 configures, a replace and a fuse.

``flexgraph plan`` then checks every function reference without importing it
(finding each module, reading its source with ``ast``); that is timed too, for
1,000 steps whose functions live in 10 generated modules of 100 functions,
cold (each source read and parsed once, as in a fresh ``flexgraph plan``).

``--estimate`` (``flexgraph plan CFG --estimate``: the model built on the meta
device, one step traced there) is timed against a bare ``python -c "import
torch"``, both in fresh processes (medians, after one untimed round that
leaves every module's bytecode cached, as an installed package has it), for
ViT-huge/14 (632 M parameters, batch 128) and a 7B Llama-style decoder (4096
tokens), and for ``--compare`` of the four candidates in docs/guide/memory.rst on ViT-huge
(three traces: fp32, AMP fp16, DeepSpeed's fp16), as a table and as a page
(``--format html``); the goal is within 3x, with a peak RSS under 1 GiB
(``--estimate-repeats 0`` skips it).

The plan page (``--format html``): its size and the time headless Chromium
takes to show it (from navigation until it has loaded, run its script and been
laid out, as the page itself reads it), for the quickstart under every built-in strategy,
goals 300 KB and 1 s; and what ``--format html`` adds to ``flexgraph plan``'s
time (fresh processes, interleaved with the text table's), goal 10%
(``--page-repeats 0`` skips them).

    python benchmarks/plan_speed.py [--repeats N] [--estimate-repeats N] [--page-repeats N]
                                    [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import Clocks, interleave, timed

from flexgraph import (
    Configure,
    Fuse,
    Graph,
    Insert,
    Move,
    Replace,
    Rewrite,
    Step,
    Strategy,
    make_plan,
)
from flexgraph.core import references, source_names

SIZES = (10, 100, 1000)
ROOT = Path(__file__).resolve().parents[1]
VIT_HUGE = ROOT / "examples" / "estimate" / "vit_huge_p14_8xb128_ddp.py"
# label -> the plan command's arguments after ``flexgraph plan``
ESTIMATED = {
    "ViT-huge/14, batch 128": [str(VIT_HUGE), "--estimate"],
    "Llama 7B, 4096 tokens": [str(ROOT / "examples" / "estimate" / "llama_7b_8xb1_fsdp.py"),
                              "--estimate"],
    # the comparison of MMEngine's PR #1183 (docs/guide/memory.rst): four candidates, three traces
    "ViT-huge/14, --compare 4": [str(VIT_HUGE), "--compare",
                                 "ddp,ddp:fp16,deepspeed:zero1:fp16,deepspeed:zero3:fp16"],
    "ViT-huge/14, --compare 4, page": [
        str(VIT_HUGE), "--compare", "ddp,ddp:fp16,deepspeed:zero1:fp16,deepspeed:zero3:fp16",
        "--format", "html", "-o", os.devnull],
}
QUICKSTART = ROOT / "examples" / "quickstart.py"
BUILT_IN = ("single", "ddp", "fsdp", "deepspeed")
TORCH_FREE = "model = dict(type='AnyModel')\nstrategy = dict(type='FSDPStrategy')\n"
"""The standard graph under FSDP, from a config that imports nothing: planning's own time."""
LAID_OUT = ('<script>addEventListener("load",function(){document.body.getBoundingClientRect();'
            'document.body.setAttribute("data-laid-out",performance.now())})</script>')
"""Appended to a copy of the page: when it had loaded, run its script and been laid out."""
GROUP = 5


def s(i: int) -> str:
    return f"s{i}"


def generated_graph(n: int) -> Graph:
    """``n`` steps in groups of five: producer, two updaters, two consumers."""
    steps = []
    for i in range(n):
        base, role = i - i % GROUP, i % GROUP
        artifact = f"a{base}"
        if role == 0:
            previous = (f"a{base - GROUP}",) if base else ("seed",)
            steps.append(Step(s(i), f"bench:f{i}", requires=previous, provides=artifact))
        elif role in (1, 2):
            steps.append(Step(s(i), f"bench:f{i}", updates=artifact))
        else:
            steps.append(Step(s(i), f"bench:f{i}", requires=artifact, provides=f"c{i}"))
    return Graph.of(steps, inputs=["seed"])


def generated_strategy(n: int) -> Strategy:
    """20 rewrites spread over the groups: 8 moves, 6 inserts, 4 configures, 1 replace, 1 fuse."""
    groups = n // GROUP
    rewrites: list[Rewrite] = []
    for k in range(8):
        g = (k * 7) % groups * GROUP
        where = {"before": s(g + 1)} if (k // groups) % 2 == 0 else {"after": s(g + 1)}
        rewrites.append(Move(s(g + 2), **where))
    for k in range(6):
        g = (k * 11 + 3) % groups * GROUP
        new = Step(f"inserted{k}", f"bench:ins{k}", updates=f"a{g}")
        rewrites.append(Insert(new, after=s(g + 1)))
    for k in range(4):
        g = (k * 13 + 1) % groups * GROUP
        rewrites.append(Configure(s(g + 3), {"k": k}))
    g = (groups // 2) * GROUP
    rewrites.append(Replace(s(g + 4), Step(s(g + 4), "bench:other", requires=f"a{g}")))
    g = (groups - 1) * GROUP
    rewrites.append(Fuse([s(g + 3), s(g + 4)], f"fused{g}"))
    return Strategy("bench", rewrites)


def import_seconds() -> float:
    """The cost of ``import flexgraph`` in a fresh interpreter."""
    code = "import time; t = time.perf_counter(); import flexgraph; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout)


def _timed_process(argv: list[str], env: dict[str, str] | None = None
                   ) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + system) of one fresh process
    running ``argv``; the CPU time is what other work on a shared machine disturbs least."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, argv)
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime  # KiB on Linux


def estimate_ratios(repeats: int) -> None:
    """``--estimate`` of each :data:`ESTIMATED` config against ``import torch`` (medians).

    Interleaved (a bare import, then each config, ``repeats`` times), so that
    load from other processes on a shared machine falls on both sides alike.
    Both sides run as an installed package does, with every module's bytecode
    cached: one untimed round first, with writing bytecode allowed (pip
    compiles a package when it installs it; a checkout writes its caches on
    the first import, unless ``PYTHONDONTWRITEBYTECODE`` says not to, which
    would leave flexgraph and the example configs compiled again in every
    timed process while torch's caches were read).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    commands = {"import torch": [sys.executable, "-c", "import torch"]}
    commands.update({label: [sys.executable, "-m", "flexgraph", "plan", *plan_args,
                             "--world-size", "8", "--device-memory", "80GB"]
                     for label, plan_args in ESTIMATED.items()})
    rounds = interleave({label: functools.partial(_timed_process, argv, env)
                         for label, argv in commands.items()}, repeats)
    torch_s = rounds.of("import torch", 0).median
    print(f"\nimport torch: {torch_s:.2f} s (median of {repeats} fresh processes, "
          f"interleaved with the estimates)")
    print(f"{'plan of':<32} {'seconds':>8} {'/ import torch':>15} {'CPU / its CPU':>14} "
          f"{'peak RSS (MiB)':>15}")
    for label in ESTIMATED:
        seconds = rounds.of(label, 0).median
        ratio = rounds.ratio(label, "import torch", 0).median
        cpu = rounds.ratio(label, "import torch", 2).median
        rss = rounds.of(label, 1).max
        print(f"{label:<32} {seconds:>8.2f} {ratio:>15.2f} {cpu:>14.2f} {rss / 2**20:>15.0f}")


def _shown_seconds(chromium: str, page: Path, profile: Path) -> float:
    """Seconds from navigation until ``page`` had loaded and was laid out, in headless Chromium."""
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", f"--user-data-dir={profile}",
                          "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return float(re.search(r'data-laid-out="([\d.]+)"', dom)[1]) / 1e3


def page_figures(repeats: int) -> None:
    """The page's size and time to show in Chromium, and what ``--format html`` adds to plan."""
    import shutil

    from flexgraph.cli.plan_cmd import load_spec_and_plan
    from flexgraph.render.html import plan_page

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as folder:
        pages, ways = {}, {}
        for strategy in BUILT_IN:
            spec, plan = load_spec_and_plan(str(QUICKSTART), strategy, [])
            page = plan_page(plan, checks=spec.resolve_strategy(strategy).checks)
            pages[strategy] = len(page.encode())
            timed_copy = Path(folder, f"{strategy}.html")
            timed_copy.write_text(page.replace("</body>", LAID_OUT + "</body>"))
            ways[strategy] = functools.partial(_shown_seconds, chromium, timed_copy,
                                               Path(folder, "profile"))
        print(f"\nthe plan page of {QUICKSTART.name}, in headless Chromium ({repeats} rounds)")
        print(f"{'strategy':<10} {'bytes':>8} {'loaded and laid out (s)':>40}")
        rounds = interleave(ways, repeats) if chromium else None
        for strategy, size in pages.items():
            shown = format(rounds.of(strategy), ".3f") if rounds else "no chromium"
            print(f"{strategy:<10} {size:>8,} {shown:>40}")
        config = Path(folder, "cfg.py")
        config.write_text(TORCH_FREE)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        commands = {}
        for label, target in (("quickstart", str(QUICKSTART)), ("torch-free cfg", str(config))):
            base = [sys.executable, "-m", "flexgraph", "plan", target, "--strategy", "fsdp"]
            commands[f"{label}: table"] = base
            commands[f"{label}: page"] = [*base, "--format", "html", "-o", os.devnull]
        plans = interleave({label: functools.partial(_timed_process, argv, env)
                            for label, argv in commands.items()}, repeats)
        print(f"\nflexgraph plan --strategy fsdp, fresh processes ({repeats} rounds)")
        for label in ("quickstart", "torch-free cfg"):
            table, page = plans.of(f"{label}: table", 0), plans.of(f"{label}: page", 0)
            print(f"{label:<16} table {table.median:.3f} s, page {page.median:.3f} s: page / "
                  f"table {plans.ratio(f'{label}: page', f'{label}: table', 0)}, in CPU "
                  f"time {plans.ratio(f'{label}: page', f'{label}: table', 2)}")
        spec, plan = load_spec_and_plan(str(QUICKSTART), "fsdp", [])
        checks = spec.resolve_strategy("fsdp").checks
        drawn = interleave({"page": functools.partial(timed, functools.partial(
            plan_page, plan, checks=checks))}, repeats)
        print(f"drawing the fsdp page in the process: "
              f"{drawn.of('page', 'cpu').median * 1e3:.1f} ms of CPU (median)")


def reference_check_seconds(n: int, repeats: int) -> float:
    """Median cost of checking ``n`` references into 10 generated modules, cold."""
    modules = 10
    with tempfile.TemporaryDirectory() as folder:
        for m in range(modules):
            body = "".join(f"def f{i}(x):\n    return x\n\n" for i in range(n // modules))
            Path(folder, f"benchmod{m}.py").write_text("import os\n\n" + body)
        sys.path.insert(0, folder)
        try:
            steps = [Step(s(i), f"benchmod{i % modules}:f{i // modules}", provides=f"o{i}")
                     for i in range(n)]
            plan = make_plan(Graph.of(steps))

            def check() -> Clocks:
                source_names._module_names.cache_clear()  # cold: every source parsed again
                return timed(lambda: references.check_references(plan))

            assert references.check_references(plan) == []
            return interleave({"check": check}, repeats).of("check", "wall").median
        finally:
            sys.path.remove(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile the 1,000-step plan")
    parser.add_argument("--estimate-repeats", type=int, default=5,
                        help="fresh processes per --estimate timing (0: skip)")
    parser.add_argument("--page-repeats", type=int, default=7,
                        help="rounds of the plan page's timings (0: skip)")
    args = parser.parse_args()

    graphs = {n: (generated_graph(n), generated_strategy(n)) for n in SIZES}
    for n, (graph, strategy) in graphs.items():
        plan = make_plan(graph, strategy)
        assert len(plan.rewrites) == 20 and len(plan.order) == n + 6 - 1
    # Planning and the import it is held against, measured in the same rounds.
    rounds = interleave({"import": import_seconds,
                         **{n: functools.partial(timed, functools.partial(make_plan, g, st))
                            for n, (g, st) in graphs.items()}}, args.repeats)
    imported = rounds.of("import").median
    print(f"import flexgraph: {imported * 1e3:8.1f} ms (median of {args.repeats} fresh processes, "
          f"interleaved with the plans)")
    print(f"{'steps':>6} {'rewrites':>8} {'plan (ms)':>10} {'cpu (ms)':>9} {'plan / import':>14}")
    for n, (_, strategy) in graphs.items():
        seconds, cpu = rounds.of(n, "wall").median, rounds.of(n, "cpu").median
        print(f"{n:>6} {len(strategy.rewrites):>8} {seconds * 1e3:>10.1f} {cpu * 1e3:>9.1f} "
              f"{rounds.ratio(n, 'import', 'wall').median:>14.2f}")
    slowest = rounds.of(SIZES[-1], "wall").median
    verdict = "under" if slowest < imported else "OVER"
    print(f"planning {SIZES[-1]} steps is {verdict} the cost of importing flexgraph")
    checked = reference_check_seconds(SIZES[-1], args.repeats)
    print(f"checking {SIZES[-1]} function references (10 modules, cold): "
          f"{checked * 1e3:.1f} ms, {checked / imported:.2f} of the import")
    if args.page_repeats:
        page_figures(args.page_repeats)
    if args.estimate_repeats:
        estimate_ratios(args.estimate_repeats)
    if args.profile:
        graph, strategy = generated_graph(SIZES[-1]), generated_strategy(SIZES[-1])
        profiler = cProfile.Profile()
        profiler.runcall(make_plan, graph, strategy)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
