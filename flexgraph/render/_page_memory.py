"""The plan page's memory tables: what each step holds per rank, estimated and measured.

The estimate's per-step figures are its ``steps``; the training step gets the
rest of the estimated peak. What a rank holds while a step runs is what it held
before plus what the step allocates (frees count after the step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from flexgraph.render.estimate import size_text

RANKS = ("rank0", "others")
MEMORIES = ("host", "device")
TRAIN_STEP = "train"


def _ranks(ranks: str) -> tuple[str, ...]:
    return RANKS if ranks == "all" else (ranks,)


def held_by_step(order: Sequence[str], candidate: Mapping[str, Any]
                 ) -> tuple[dict[str, dict[tuple[str, str], int]], dict[str, list[str]]]:
    """Bytes each rank class holds while each step runs, and what each step allocates, in words."""
    steps = candidate.get("steps") or {}
    allocations = steps.get("allocations", [])
    held = dict.fromkeys(((r, m) for r in RANKS for m in MEMORIES), 0)
    rows: dict[str, dict[tuple[str, str], int]] = {}
    said: dict[str, list[str]] = {}
    for name in order:
        during = dict(held)
        for a in (a for a in allocations if a["step"] == name):
            for rank in _ranks(a["ranks"]):
                if a["bytes"] > 0:
                    during[rank, a["memory"]] += a["bytes"]
                if not a["transient"]:
                    held[rank, a["memory"]] += a["bytes"]
            who = {"all": "every rank", "rank0": "rank 0", "others": "the other ranks"}[
                a["ranks"]]
            sign = "+" if a["bytes"] >= 0 else "-"
            how = " while it runs" if a["transient"] else ""
            size = f" {sign}{size_text(abs(a['bytes']))} {a['memory']}{how}" if a["bytes"] else ""
            said.setdefault(name, []).append(f"{who}{size}: {a['what']}")
        if name == TRAIN_STEP and candidate.get("peak_bytes") is not None:
            memory = steps.get("trains_on", "device")
            for rank in RANKS:
                rest = max(candidate["peak_bytes"] - during[rank, memory], 0)
                during[rank, memory] += rest
                held[rank, memory] += rest
            said.setdefault(name, []).append(
                f"every rank up to the training peak ({candidate.get('phase', '')}): gradients, "
                f"optimizer states, activations and buffers")
        rows[name] = during
    return rows, said


def columns(rows: Mapping[str, Mapping[tuple[str, str], int]], world_size: int
            ) -> list[tuple[str, tuple[str, str]]]:
    """``(header, (rank, memory))`` of the columns worth showing; rank 0 apart if it differs."""
    out = []
    for memory in MEMORIES:
        if not any(r[rank, memory] for r in rows.values() for rank in RANKS):
            continue
        if world_size == 1:
            out.append((f"{memory}", ("rank0", memory)))
        elif all(r["rank0", memory] == r["others", memory] for r in rows.values()):
            out.append((f"{memory}, every rank", ("rank0", memory)))
        else:
            out += [(f"{memory}, rank 0", ("rank0", memory)),
                    (f"{memory}, each other rank", ("others", memory))]
    return out


def _bar_cell(value: int | None, largest: int, peak: bool, label: str) -> str:
    if value is None:
        return "<td>-</td>"
    width = 100 * value / largest if largest else 0
    mark = ' <b class="peak-mark">peak</b>' if peak else ""
    return (f'<td class="num{" peak" if peak else ""}" data-label="{escape(label)}">'
            f'<span class="bar" style="width:{width:.0f}%"></span>'
            f"<span>{size_text(value)}</span>{mark}</td>")


def _rises(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Each step's high-water mark above the resident memory after the first step."""
    start = records[0].get("rss_bytes") if records else None
    return {r["step"]: r["peak_rss_bytes"] - start for r in records
            if start is not None and r.get("peak_rss_bytes") is not None}


def _measured_cell(peak: int | None, rise: int | None, largest: int) -> str:
    if peak is None:
        return "<td>-</td>"
    width = 100 * (rise or 0) / largest if largest else 0
    above = f' <small>(+{size_text(rise)})</small>' if rise else ""
    return (f'<td class="num"><span class="bar measured" style="width:{width:.0f}%"></span>'
            f"<span>{size_text(peak)}</span>{above}</td>")


def peak_lines(rows: Mapping[str, Mapping[tuple[str, str], int]],
               cols: Sequence[tuple[str, tuple[str, str]]]) -> list[str]:
    """One sentence per column: where it peaks, and how high."""
    lines = []
    for header, key in cols:
        step = max(rows, key=lambda n: rows[n][key])
        who = header.split(", ")[-1] if ", " in header else "the rank"
        lines.append(f"{header.split(',')[0]} memory, {who}: peak {size_text(rows[step][key])} "
                     f"while {step} runs")
    return lines


def estimate_table(order: Sequence[str], candidate: Mapping[str, Any], world_size: int,
                   measured: Sequence[Sequence[Mapping[str, Any]]] = (), prefix: str = "",
                   compact: bool = False) -> str:
    """The per-step table; ``compact`` leaves out what each step allocates, in words."""
    rows, said = held_by_step(order, candidate) if candidate else ({}, {})
    cols = columns(rows, world_size) if rows else []
    largest = {key: max((r[key] for r in rows.values()), default=0) for _, key in cols}
    peak_at = {key: max(rows, key=lambda n, k=key: rows[n][k]) for _, key in cols}
    by_rank = [{r["step"]: r for r in records} for records in measured]
    device = any(r.get("device_peak_bytes") is not None for rs in measured for r in rs)
    head = ["#", "step", *(f"estimated: {h}" for h, _ in cols)]
    for rank in range(len(by_rank)):
        head += [f"rank {rank}: seconds", f"rank {rank}: peak host (above the first step)"]
        head += [f"rank {rank}: peak device"] if device else []
    if rows and not compact:
        head.append("what the step allocates (estimated)")
    out = ['<table class="memory"><thead><tr>'
           + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    rises = [_rises(records) for records in measured]
    largest_rise = max((v for r in rises for v in r.values()), default=0)
    for position, name in enumerate(order, 1):
        cells = [f"<td>{position}</td>", f'<th scope="row">{escape(name)}</th>']
        cells += [_bar_cell(rows[name][key], largest[key], peak_at[key] == name,
                            f"{h} at {name}") for h, key in cols]
        for rank, records in enumerate(by_rank):
            record = records.get(name, {})
            seconds = record.get("seconds")
            cells.append(f'<td class="num">{"-" if seconds is None else f"{seconds:.3f}"}</td>')
            cells.append(_measured_cell(record.get("peak_rss_bytes"), rises[rank].get(name),
                                        largest_rise))
            if device:
                cells.append(f'<td class="num">{size_text(record.get("device_peak_bytes"))}'
                             "</td>")
        if rows and not compact:
            cells.append('<td class="what">' + "<br>".join(escape(line) for line in said.get(
                name, [])) + "</td>")
        out.append(f'<tr id="memory-{escape(prefix + name)}">' + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    lines = peak_lines(rows, cols) if rows else []
    return ("".join(f'<p class="peak-line">{escape(line)}</p>' for line in lines)
            + '<div class="scroll">' + "".join(out) + "</div>")
