"""The plan page's picture: the base order and the planned order side by side, as SVG.

Laid out here, no layout engine: one row per aligned step (:mod:`._align`). All
text is monospace, so its width is known and every line is wrapped before drawing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from html import escape

from rich.text import Text

from flexgraph.render._page_model import Box, Change, PageModel
from flexgraph.render._wrap import wrap

CHAR = 7.3
"""Width of one character of the picture's 12 px monospace font, rounded up."""
LINE = 15
PAD = 8
BOX_LINE = 22
GUTTER = 130
ARCS = 90
NOTE_CHARS = 78

COLOURS = {
    "base": ("#f8f9fa", "#868e96"),
    "user": ("#fff0f6", "#a61e4d"),
    "inserted": ("#d3f9d8", "#2b8a3e"),
    "moved": ("#fff3bf", "#e67700"),
    "placed": ("#fff9db", "#f08c00"),
    "replaced": ("#f3d9fa", "#862e9c"),
    "fused": ("#d0ebff", "#1864ab"),
    "configured": ("#e7f5ff", "#1971c2"),
    "removed": ("#ffe3e3", "#c92a2a"),
    "pruned": ("#ffe3e3", "#c92a2a"),
    "skipped": ("#ffffff", "#868e96"),
}
"""(fill, stroke) of a box or note, by the action that placed or changed it."""

MARKERS = {"base": " ", "user": "u", "inserted": "+", "moved": "~", "replaced": "!",
           "fused": "&", "configured": "*", "removed": "-", "pruned": "-", "placed": ">"}

LEGEND = (
    ("inserted", "inserted: a step the strategy added"),
    ("moved", "moved: drawn from its old place to its new one"),
    ("replaced", "replaced: another function in its place"),
    ("fused", "fused: one step doing the work of the steps drawn into it"),
    ("configured", "configured: its parameters changed"),
    ("removed", "removed or pruned: the plan runs without it"),
    ("user", "user: a step the config added"),
    ("placed", "placed by need: a step of yours put where what it needs of the model holds"),
    ("base", "as declared by the base graph"),
)


def _colour(action: str) -> tuple[str, str]:
    return COLOURS.get(action, COLOURS["configured"])


def _lines(text: str, chars: int) -> list[str]:
    return wrap(Text(text), chars).plain.split("\n")


def _text(x: float, y: float, lines: Sequence[str], cls: str = "",
          colour: str | None = None) -> str:
    fill = f' style="fill:{colour}"' if colour else ""
    spans = "".join(f'<tspan x="{x:.0f}" dy="{LINE if i else 0}">{escape(line)}</tspan>'
                    for i, line in enumerate(lines))
    return f'<text class="{cls}" x="{x:.0f}" y="{y:.0f}"{fill}>{spans}</text>'


def _box_lines(box: Box) -> list[str]:
    yours = " (yours)" if box.user and box.action != "user" else ""
    lines = [f"{box.position:>2} {MARKERS.get(box.action, '?')} {box.name}{yours}"]
    if box.parts:
        lines += [f"     = {part}" for part in box.parts]
    if box.gained or box.lost:
        lines.append("     model " + " ".join([*(f"+{f}" for f in box.gained),
                                             *(f"-{f}" for f in box.lost)]))
    if box.needs:
        lines.append("     needs " + ", ".join(box.needs))
    return lines


def _notes(box: Box | None, base: Box | None, model: PageModel) -> list[tuple[str, str]]:
    """(line, action) of the notes beside a row: its rewrites, what the step does, why."""
    notes: list[tuple[str, str]] = []
    changes: list[Change] = list(model.changes.get(box.name, ())) if box else []
    if base is not None and box is None:
        changes = [c for c in model.changes.get(base.name, ())
                   if c.action not in ("moved", "placed")]
        if base.action in ("moved", "placed"):
            how = "moves" if base.action == "moved" else "is placed by its needs"
            notes.append((f"{base.name} {how} from here (see below)", base.action))
        if base.name in model.fused_parts:  # its rewrite is said at the fused step
            label = next(c.label for c in changes if c.action == "fused")
            return [(f"{label}: {base.name} is a part of {model.fused_parts[base.name]}",
                     "fused")]
    for change in changes:
        said = f"{change.label} {change.action}: {change.text}".lstrip()
        for i, line in enumerate(_lines(said, NOTE_CHARS)):
            notes.append((line if i == 0 else "  " + line, change.action))
        if change.why:
            notes += [("  " + line, "why") for line in _lines(f"why: {change.why}",
                                                               NOTE_CHARS - 2)]
    if box is not None and changes and box.doc and box.action in ("inserted", "replaced",
                                                                  "fused", "user", "placed"):
        notes += [("  " + line, "does") for line in _lines(f"does: {box.doc}", NOTE_CHARS - 2)]
    if box is not None:
        for reason in model.reasons.get(box.name, ()):
            notes += [("  " + line, "why") for line in _lines(f"why: {reason}",
                                                               NOTE_CHARS - 2)]
    if box is not None and box.user:
        doc = f": {box.doc}" if box.doc and not changes else ""
        notes.append((f"the config's own step{doc}", "user"))
    return notes


def _legend(width: float, model: PageModel) -> tuple[list[str], float]:
    out, x, y = [], 12.0, 20.0
    for action, words in LEGEND:
        w = 26 + len(words) * CHAR + 18
        if x + w > width and x > 12:
            x, y = 12.0, y + LINE + 6
        fill, stroke = _colour(action)
        out.append(f'<rect x="{x:.0f}" y="{y - 11:.0f}" width="20" height="14" rx="3" '
                   f'fill="{fill}" stroke="{stroke}"/>')
        out.append(_text(x + 26, y, [words], "legend"))
        x += w
    y += LINE + 6
    said = ("thin line: the same step in both orders; curve: a moved step; '= name': a part of "
            "a fused step")
    if model.has_state:
        said += ("; 'model +fact -fact': what the step changes in the model; 'needs': what it "
                 "needs of the model it receives")
    out.append(_text(12, y, [said], "legend"))
    return out, y + 12


def _box(box: Box, side: str, x: float, y: float, width: float) -> str:
    """One step's box; on the base side only its name (what the plan did is on the right)."""
    lines = _box_lines(box if side == "plan" else Box(box.name, box.position, box.action))
    fill, stroke = _colour(box.action)
    dashed = ' stroke-dasharray="5 3"' if side == "base" and box.action != "base" else ""
    gone = " gone" if side == "base" and box.action in ("removed", "pruned", "fused",
                                                         "replaced") else ""
    doc = f": {escape(box.doc)}" if box.doc else ""
    return (f'<g class="step {side}{gone}" data-step="{escape(box.name)}">'
            f"<title>{escape(box.name)}{doc}</title>"
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{width:.0f}" height="{len(lines) * LINE + 8}" '
            f'rx="4" fill="{fill}" stroke="{stroke}"{dashed}/>'
            + _text(x + PAD, y + 16, lines, "name") + "</g>")


def plan_svg(model: PageModel, title: str) -> str:
    boxes = [b for row in model.rows for b in row if b is not None]
    chars = max(len(line) for b in boxes for line in _box_lines(b))
    box_w = chars * CHAR + 2 * PAD
    base_x, plan_x = 12.0, 12.0 + box_w + GUTTER
    note_x = plan_x + box_w + ARCS
    width = note_x + NOTE_CHARS * CHAR + 24
    legend, y = _legend(width, model)
    parts = [*legend]
    parts.append(_text(base_x, y + 14, ["base graph (as declared)"], "heading"))
    parts.append(_text(plan_x, y + 14, [title], "heading"))
    parts.append(_text(note_x, y + 14, ["what changed, and why"], "heading"))
    y += 28
    centre: dict[tuple[str, str], float] = {}
    drawn, later = [], []
    for base, planned in model.rows:
        notes = _notes(planned, base, model)
        heights = [len(_box_lines(b)) for b in (base, planned) if b is not None]
        height = max(max(heights) * LINE + 8, len(notes) * LINE) + 12
        for box, x, side in ((base, base_x, "base"), (planned, plan_x, "plan")):
            if box is not None:
                drawn.append(_box(box, side, x, y, box_w))
                centre[side, box.name] = y + BOX_LINE / 2 + 2
        for i, (line, action) in enumerate(notes):
            colour = _colour(action)[1] if action in COLOURS else None
            cls = "note" if action not in ("why", "does") else f"note {action}"
            drawn.append(_text(note_x, y + 14 + i * LINE, [line], cls, colour))
        if base is not None and planned is not None:
            kind = "same" if base.name == planned.name else base.action
            later.append(_link(base_x + box_w, centre["base", base.name], plan_x,
                               centre["plan", planned.name], kind))
        y += height
    for base, planned in model.rows:  # moves and fused parts that have no row of their own
        if base is None or planned is not None:
            continue
        target = base.name if base.action in ("moved", "placed") else model.fused_parts.get(
            base.name)
        if ("plan", target) in centre:
            later.append(_link(base_x + box_w, centre["base", base.name], plan_x,
                               centre["plan", target], base.action))
    arcs = list(_arcs(model, centre, plan_x + box_w))
    y += 8
    if model.skipped:
        drawn.append(_text(12, y + 14, ["conditional rewrites skipped: their condition did "
                                        "not hold in this plan"], "heading"))
        y += 22
        for change in model.skipped:
            lines = _lines(f"{change.label} skipped: {change.text} (skipped: {change.why})",
                           int((width - 40) / CHAR))
            drawn.append(_text(24, y + 14, lines, "note", _colour("skipped")[1]))
            y += len(lines) * LINE + 4
    height = y + 16
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="plan" width="{width:.0f}" '
            f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
            f'aria-label="{escape(title)}: base order and plan order side by side">'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            f'fill="{COLOURS["moved"][1]}"/></marker></defs>'
            + "".join(parts) + "".join(later) + "".join(drawn)
            + '<g class="edges">' + "".join(arcs) + "</g></svg>")


def _link(x1: float, y1: float, x2: float, y2: float, kind: str) -> str:
    mid = (x1 + x2) / 2
    arrow = ' marker-end="url(#arrow)"' if kind in ("moved", "placed") else ""
    return (f'<path class="link {kind}" d="M{x1:.0f},{y1:.0f} C{mid:.0f},{y1:.0f} '
            f'{mid:.0f},{y2:.0f} {x2 - 2:.0f},{y2:.0f}"{arrow}/>')


def _arcs(model: PageModel, centre: dict[tuple[str, str], float], x: float) -> Iterator[str]:
    for edge in model.edges:
        y1, y2 = centre.get(("plan", edge.source)), centre.get(("plan", edge.target))
        if y1 is None or y2 is None:
            continue
        reach = min(ARCS - 8, 10 + abs(y2 - y1) / 6)
        what = ", ".join(edge.artifacts) or "order"
        yield (f'<path class="edge{"" if edge.artifacts else " order"}" '
               f'data-source="{escape(edge.source)}" data-target="{escape(edge.target)}" '
               f'data-what="{escape(what)}" d="M{x:.0f},{y1:.0f} C{x + reach:.0f},{y1:.0f} '
               f'{x + reach:.0f},{y2:.0f} {x:.0f},{y2:.0f}"><title>{escape(edge.source)} -> '
               f'{escape(edge.target)}: {escape(edge.reason)}</title></path>')
