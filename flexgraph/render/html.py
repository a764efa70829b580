"""The plan as one self-contained HTML page (``flexgraph plan --format html``).

The page holds its style, picture and script and loads nothing, so it opens
offline and from a run's folder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from flexgraph.core.plan import Plan
from flexgraph.core.states import FACTS
from flexgraph.render._page_memory import estimate_table
from flexgraph.render._page_model import PageModel, page_model
from flexgraph.render._page_svg import COLOURS, plan_svg
from flexgraph.render.estimate import size_text
from flexgraph.render.json_view import plan_to_dict

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 24px 40px;
color:#212529;background:#fff}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;margin:28px 0 8px}
.summary{max-width:70em}
.controls{position:sticky;top:0;background:#fff;padding:6px 0;z-index:1}
.controls button{font:inherit;padding:2px 10px;margin-right:4px}
.picture{overflow:auto;border:1px solid #dee2e6;border-radius:6px}
svg.plan{display:block}
svg.plan text{font:12px ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;
fill:#212529;white-space:pre}
svg.plan text.heading{font-weight:bold;font-size:13px}
svg.plan text.legend{fill:#495057}
svg.plan text.why{fill:#495057}svg.plan text.does{fill:#495057;font-style:italic}
svg.plan .gone text{text-decoration:line-through}
svg.plan .link{fill:none;stroke:#adb5bd;stroke-width:1.2}
svg.plan .link.moved{stroke:#e67700;stroke-width:2.2}
svg.plan .link.placed{stroke:#f08c00;stroke-width:2.2;stroke-dasharray:6 3}
svg.plan .link.fused{stroke:#1864ab;stroke-width:1.8}
svg.plan .link.replaced{stroke:#862e9c;stroke-width:1.8}
svg.plan .edge{fill:none;stroke:#5c7cfa;stroke-width:1.3;display:none}
svg.plan .edge.order{stroke-dasharray:4 3}
body:has(#show-edges:checked) svg.plan .edge,svg.plan .edge.lit{display:inline}
svg.plan .edge.lit{stroke:#e8590c;stroke-width:2.4}
svg.plan .step:hover rect{stroke-width:2.5}
#edge-info{min-height:1.4em;color:#495057;font-size:14px}
table{border-collapse:collapse;font-size:14px}
th,td{padding:3px 10px;border-bottom:1px solid #e9ecef;text-align:left;vertical-align:top}
thead th{position:sticky;top:0;background:#f8f9fa}
td.num{text-align:right;white-space:nowrap;position:relative}
td.num .bar{position:absolute;left:0;top:3px;bottom:3px;background:#e7f5ff;z-index:-1}
td.num .bar.measured{background:#fff3bf}
td.num{z-index:0}td.peak{font-weight:bold}.peak-mark{color:#c92a2a}
td.what{font-size:13px;color:#495057;max-width:40em}
.scroll{overflow:auto}
ol.rewrites li{margin:2px 0}.skipped{color:#868e96}.why{color:#495057}
.cards{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.card{border:1px solid #dee2e6;border-radius:6px;padding:8px 12px;max-width:100%}
.fits{color:#2b8a3e;font-weight:bold}.fits.no{color:#c92a2a}
"""

SCRIPT = """
(function(){
var svgs=document.querySelectorAll('svg.plan'),scale=1;
function zoom(f){scale=f?scale*f:1;svgs.forEach(function(s){
 s.style.width=(s.viewBox.baseVal.width*scale)+'px';s.style.height='auto';});}
document.querySelectorAll('[data-zoom]').forEach(function(b){b.addEventListener('click',
 function(){var z=b.dataset.zoom;zoom(z==='1'?0:parseFloat(z));});});
var info=document.getElementById('edge-info');
document.querySelectorAll('svg.plan .step.plan').forEach(function(g){
 var name=g.dataset.step,svg=g.ownerSVGElement;
 g.addEventListener('mouseenter',function(){var said=[];
  svg.querySelectorAll('.edge').forEach(function(e){
   if(e.dataset.source===name||e.dataset.target===name){e.classList.add('lit');
    said.push(e.dataset.source+' \\u2192 '+e.dataset.target+' ('+e.dataset.what+')');}});
  if(info)info.textContent=said.length?name+': '+said.join('; '):name+': no data edges';});
 g.addEventListener('mouseleave',function(){
  svg.querySelectorAll('.edge.lit').forEach(function(e){e.classList.remove('lit');});});
});
})();
"""


def _checks(checks: Sequence[Any]) -> list[dict[str, str]]:
    """Order checks as dicts; a check that orders no two steps (``Runs``) is left out."""
    out = []
    for check in checks:
        item = dict(check) if isinstance(check, Mapping) else {
            k: getattr(check, k, None) for k in ("first", "then", "why")}
        if item.get("first") and item.get("then"):
            out.append(item)
    return out


def _model(plan: Plan | Mapping[str, Any], checks: Sequence[Any]) -> PageModel:
    if isinstance(plan, Plan):
        docs = {s.name: s.doc for s in plan.base.steps}
        docs.update({s.name: s.doc for s in plan.steps})
        return page_model(plan_to_dict(plan), checks=_checks(checks), docs=docs)
    return page_model(plan, checks=_checks(checks))


def _title(model: PageModel) -> str:
    return f"{model.strategy} plan (as it runs)" if model.strategy else "the plan (as it runs)"


def _summary(model: PageModel) -> str:
    applied = [c for c in model.rewrites if c.action != "skipped"]
    touched = sorted(n for n, cs in model.changes.items() if any(c.label for c in cs))
    placed = sorted(n for n, cs in model.changes.items() if any(not c.label for c in cs))
    if not model.rewrites:
        return "No strategy rewrites: the plan runs the base graph as declared."
    who = model.strategy or "the rewrites"
    held = sum(1 for c in applied if c.held)
    held_said = f" ({held} conditional, their condition held)" if held else ""
    skipped = f"; {len(model.skipped)} conditional ones skipped" if model.skipped else ""
    placed_said = (f"; placed by their needs, not at their anchors: {', '.join(placed)}"
                   if placed else "")
    return (f"{who} changed {len(touched)} steps ({', '.join(touched)}) with "
            f"{len(applied)} rewrites{held_said}{skipped}{placed_said}. Each change is drawn "
            "at its step with its reason; the list below says them again in order.")


def _rewrite_list(model: PageModel) -> str:
    items = []
    for change in model.rewrites:
        cls = ' class="skipped"' if change.action == "skipped" else ""
        why = f' <span class="why">(applied: {escape(change.held)})</span>' if change.held else ""
        if change.why:
            word = "skipped: " if change.action == "skipped" else "why: "
            why += f' <span class="why">({escape(word + change.why)})</span>'
        colour = COLOURS.get(change.action, COLOURS["configured"])[1]
        items.append(f'<li{cls}><b style="color:{colour}">{escape(change.label)} '
                     f"{escape(change.action)}</b>: {escape(change.text)}{why}</li>")
    reasons = [f"<li><b>{escape(step)}</b> {escape(reason)}</li>"
               for step, said in model.reasons.items() for reason in said]
    out = f'<ol class="rewrites">{"".join(items)}</ol>' if items else "<p>none</p>"
    if reasons:
        out += ("<h3>The orders the strategy relies on, and why</h3>"
                f'<ul class="reasons">{"".join(reasons)}</ul>')
    return out


CONTROLS = ('<div class="controls"><button data-zoom="1.25">zoom in</button>'
            '<button data-zoom="0.8">zoom out</button><button data-zoom="1">full size</button>'
            '<label><input type="checkbox" id="show-edges"> show the data edges</label> '
            '(or hover a step of the plan to see its own)'
            '<div id="edge-info" aria-live="polite"></div></div>')


def _model_table(model: PageModel, prefix: str) -> str:
    """The model after each step that has it: its facts, what the step changed, its needs."""
    if not model.has_state:
        return ""
    rows, seen = [], set()
    for _, box in model.rows:
        if box is None or not (box.facts or box.lost):
            continue
        seen.update(box.facts)
        changed = " ".join([*(f"+{f}" for f in box.gained), *(f"-{f}" for f in box.lost)])
        cells = [str(box.position), box.name + (" (yours)" if box.user else ""),
                 ", ".join(box.facts), changed, ", ".join(box.needs)]
        rows.append(f'<tr id="model-{escape(prefix + box.name)}">'
                    + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    meanings = escape("; ".join(f"{f}: {FACTS[f]}" for f in sorted(seen) if f in FACTS))
    return ("<h2>The model after each step</h2><div class=\"scroll\"><table><thead><tr>"
            "<th>#</th><th>step</th><th>the model after it</th><th>changed</th>"
            f"<th>needs</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            + (f'<p class="summary">{meanings}.</p>' if meanings else ""))


def _picture(model: PageModel, heading: str, prefix: str = "") -> str:
    return (f"<h2>{escape(heading)}</h2>"
            f'<div class="picture">{plan_svg(model, _title(model))}</div>'
            f"<h2>The rewrites, in order</h2>{_rewrite_list(model)}"
            + _model_table(model, prefix))


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            f"{body}<script>{SCRIPT}</script></body></html>\n")


def _estimate_section(model: PageModel, candidate: Mapping[str, Any], world_size: int,
                      measured: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    if candidate:
        head = (f"<h2>Memory per step and rank: estimated{' and measured' if measured else ''}"
                "</h2>")
        setup = candidate.get("setup") or {}
        facts = [f"{world_size} rank(s); training peak {size_text(candidate['peak_bytes'])} "
                 f"per rank ({escape(str(candidate.get('phase')))})"]
        if setup:
            facts.append(f"setup (until the optimizer exists): rank 0 "
                         f"{size_text(setup['rank0_bytes'])}, each other rank "
                         f"{size_text(setup['other_bytes'])} of host memory")
        if candidate.get("fits") is not None:
            facts.append("fits the device" if candidate["fits"] else "does NOT fit the device")
        head += f"<p>{escape('; '.join(facts))}.</p>"
    else:
        head = "<h2>Measured per step and rank</h2>"
    if measured:
        head += ("<p>Measured on every rank: each step's wall time, and the process's "
                 "high-water mark of resident memory (VmHWM) when the step ended, interpreter "
                 "and libraries included, with its rise above the first step's resident memory "
                 "in brackets (the estimate counts the model's bytes alone).</p>")
    return head + estimate_table(model.order, candidate, world_size, measured)


def plan_page(plan: Plan | Mapping[str, Any], *, checks: Sequence[Any] = (),
              estimate: Mapping[str, Any] | None = None,
              measured: Sequence[Sequence[Mapping[str, Any]]] = (),
              source: str = "") -> str:
    model = _model(plan, checks)
    who = model.strategy or "no strategy"
    title = f"flexgraph plan: {who}" + (f" - {source}" if source else "")
    body = (f"<h1>{escape(title)}</h1>"
            f'<p class="summary">{escape(_summary(model))}</p>' + CONTROLS
            + _picture(model, f"What {who} changed, and why"))
    if estimate or measured:
        candidate = (estimate or {}).get("candidates", [{}])[0] if estimate else {}
        world = (estimate or {}).get("world_size") or max(len(measured), 1)
        body += _estimate_section(model, candidate, world, measured)
    return _page(title, body)


def compare_page(report: Mapping[str, Any],
                 plans: Mapping[str, tuple[Plan | Mapping[str, Any], Sequence[Any]]],
                 source: str = "") -> str:
    """The candidates of a ``--compare`` side by side, each with its verdict and its plan."""
    world = report.get("world_size") or 1
    device = report.get("device_memory") or {}
    title = "flexgraph plan --compare" + (f" - {source}" if source else "")
    cards, pictures = [], []
    for candidate in report["candidates"]:
        label = candidate["candidate"]
        plan, checks = plans[label]
        model = _model(plan, checks)
        fits = candidate.get("fits")
        verdict = {True: "fits", False: "does NOT fit", None: "not traced"}[fits]
        setup = candidate.get("setup") or {}
        said = (f"peak {size_text(candidate['peak_bytes'])} per rank "
                f"({candidate.get('phase')})")
        if setup:
            said += (f"; setup: rank 0 {size_text(setup['rank0_bytes'])}, others "
                     f"{size_text(setup['other_bytes'])}"
                     + ("" if setup.get("fits", True) else " (does NOT fit the node)"))
        cards.append(f'<div class="card"><h2>{escape(label)}: <span class="fits'
                     f'{"" if fits else " no"}">{verdict}</span></h2><p>{escape(said)}</p>'
                     + estimate_table(model.order, candidate, world, prefix=f"{label}-",
                                      compact=True)
                     + "</div>")
        pictures.append(f"<details><summary>{escape(label)}: what it changed, and why"
                        f"</summary>{_picture(model, label, f'{label}-')}</details>")
    where = (f"against {size_text(device['bytes'])} of device memory ({device['source']})"
             if device else "")
    body = (f"<h1>{escape(title)}</h1><p class=\"summary\">{len(cards)} candidates, "
            f"{world} rank(s), {escape(where)}.</p>"
            f'<div class="cards">{"".join(cards)}</div>' + CONTROLS + "".join(pictures))
    return _page(title, body)
