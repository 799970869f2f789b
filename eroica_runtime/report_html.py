"""report.html: one self-contained page (inline SVG and CSS, no JavaScript, no network).

Every name that came from a summary (hosts, functions, triggers) is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

from eroica_runtime.engine import epochs, imbalance, launchskew, longsteps, settings, steadywork
from eroica_runtime.report import (
    calls_text,
    capture_label,
    format_time_lost,
    if_fixed_text,
    impact_text,
    is_healthy,
    job_held_text,
    job_profiler_text,
    one_off_text,
    passing_text,
    ranks_text,
    refused_summary,
    slower_text,
    stood_down_text,
    transient_lines,
)

FULL_HEALTHY = 8   # healthy captures shown in full, the newest (_brief_steps)

_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px}h2{font-size:17px;margin-top:28px}h3{font-size:15px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
.cat{font-weight:bold;text-transform:uppercase}.muted{color:#777}.ok{color:#2a7a2a;font-weight:bold}
svg text{font:11px system-ui,sans-serif}"""


def _e(x: Any) -> str:
    return escape(str(x), quote=True)


def _short(v: Any, limit: int = 400) -> str:
    """Job values can be per-rank lists of 100k entries: show the start and how much was cut."""
    text = str(v)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters in report.json)"


def _num(x: Any, fmt: str = ".1f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "–"


def _cell(v: Any) -> str:
    """A table cell: ms to a tenth (report.json keeps the full figure), anything else as it is."""
    return f"{v:.1f}" if isinstance(v, float) else _short(v)


def _timeline(steps: dict[str, list] | None, captures: list[dict[str, Any]], width: int = 1000,
              height: int = 220) -> str:
    if not steps or not steps.get("steps"):
        return '<p class="muted">No step history (steps.msgpack) in this report directory.</p>'
    xs, ys = steps["steps"], steps["ms"]
    stride = max(1, len(xs) // 2000)
    xs, ys = xs[::stride], ys[::stride]
    x0, x1 = min(xs), max(xs) or 1
    y1 = max(ys) * 1.1 or 1.0
    pad = 40

    def px(x: float) -> float:
        return pad + (x - x0) / max(x1 - x0, 1) * (width - 2 * pad)

    def py(y: float) -> float:
        return height - pad + -(y / y1) * (height - 2 * pad)

    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
    marks = []
    for c in captures:
        s = c.get("step")
        if isinstance(s, int):
            color = "#c0392b" if c.get("findings") else "#2a7a2a"
            marks.append(f'<line x1="{px(s):.1f}" x2="{px(s):.1f}" y1="{pad - 10}" y2="{height - pad}" '
                         f'stroke="{color}" stroke-dasharray="4 3"/><text x="{px(s) + 3:.1f}" y="{pad - 12}" '
                         f'fill="{color}">{_e(s)} {_e(c.get("trigger", ""))}</text>')
    axis = (f'<line x1="{pad}" x2="{width - pad}" y1="{height - pad}" y2="{height - pad}" stroke="#888"/>'
            f'<line x1="{pad}" x2="{pad}" y1="{pad}" y2="{height - pad}" stroke="#888"/>'
            f'<text x="2" y="{pad + 4}">{_num(y1, ".0f")} ms</text><text x="2" y="{height - pad}">0</text>'
            f'<text x="{pad}" y="{height - pad + 16}">step {_e(x0)}</text>'
            f'<text x="{width - pad - 60}" y="{height - pad + 16}">step {_e(x1)}</text>')
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="step time timeline">'
            f'{axis}<polyline fill="none" stroke="#2c6fbb" stroke-width="1.2" points="{pts}"/>'
            f'{"".join(marks)}</svg>')


def _heatmap(table: dict[str, Any]) -> str:
    cols, rows = table.get("columns") or [], table.get("rows") or []
    if not cols or not rows:
        return '<p class="muted">No per-rank phases recorded.</p>'
    cw, rh, lw = 78, 16, 260
    # colour = deviation from the column's median over the shown rows (red above, blue below), so
    # the culprit's grown phase and its short wait stand out while equal ranks stay pale
    meds = []
    for j in range(len(cols)):
        vals = sorted(float(r["values"][j] or 0.0) for r in rows)
        meds.append(vals[len(vals) // 2] if vals else 0.0)
    out = [f'<svg width="{lw + cw * len(cols) + 10}" height="{rh * (len(rows) + 1) + 10}" role="img" '
           'aria-label="ranks by phases heatmap">']
    for j, c in enumerate(cols):
        out.append(f'<text x="{lw + j * cw + 4}" y="12">{_e(c)}</text>')
    for i, r in enumerate(rows):
        y = rh * (i + 1)
        color = {"culprit": "#c0392b", "median": "#555"}.get(r.get("kind"), "#222")
        out.append(f'<text x="2" y="{y + 12}" fill="{color}">{_e(r.get("label", ""))}</text>')
        for j, v in enumerate(r["values"]):
            v = float(v or 0.0)
            med = meds[j]
            dev = (v - med) / max(abs(med), 1.0)
            a = min(abs(dev), 1.0)
            fill = (f"rgb(255,{255 - int(190 * a)},{255 - int(200 * a)})" if dev >= 0
                    else f"rgb({255 - int(190 * a)},{255 - int(120 * a)},255)")
            out.append(f'<rect x="{lw + j * cw}" y="{y}" width="{cw - 2}" height="{rh - 2}" '
                       f'fill="{fill}">'
                       f'<title>{_e(r.get("label", ""))} {_e(cols[j])}: {v:.2f} ms</title></rect>'
                       f'<text x="{lw + j * cw + 4}" y="{y + 11}">{v:.1f}</text>')
    out.append("</svg>")
    return "".join(out)


def _bars(fns: list[dict[str, Any]], width: int = 900) -> str:
    items = []
    for f in fns[:8]:
        if "rank_ms" in f:
            items.append((f["name"], float(f["rank_ms"]), float(f["peers_ms"]), "rank", "peer median",
                          calls_text(f.get("rank_calls"), f.get("peers_calls"))))
        elif "now_ms" in f:
            items.append((f["name"], float(f["now_ms"]), float(f["baseline_ms"]), "now", "baseline",
                          calls_text(f.get("now_calls"), f.get("baseline_calls"))))
    if not items:
        return ""
    top = max(max(a, b) for _, a, b, _, _, _ in items) or 1.0
    lw, bw, rh = 360, width - 600, 30   # room after the longest bar for "48.4 vs 3.3 ms, 162 vs 2 calls"
    out = [f'<svg width="{width}" height="{rh * len(items) + 10}" role="img" aria-label="function bars">']
    for i, (name, a, b, la, lb, calls) in enumerate(items):
        y = i * rh + 4
        short = name if len(name) <= 56 else name[:26] + "…" + name[-28:]
        out.append(f'<text x="0" y="{y + 14}"><title>{_e(name)}</title>{_e(short)}</text>'
                   f'<rect x="{lw}" y="{y}" width="{bw * a / top:.1f}" height="11" fill="#c0392b">'
                   f'<title>{_e(la)} {a:.2f} ms</title></rect>'
                   f'<rect x="{lw}" y="{y + 12}" width="{bw * b / top:.1f}" height="11" fill="#95a5a6">'
                   f'<title>{_e(lb)} {b:.2f} ms</title></rect>'
                   f'<text x="{lw + bw * max(a, b) / top + 4:.1f}" y="{y + 16}">{a:.1f} vs {b:.1f} ms{_e(calls)}</text>')
    out.append("</svg>")
    return "".join(out)


def _finding_rows(findings: list[dict[str, Any]]) -> str:
    if not findings:
        return '<p class="ok">No findings: ranks behaved like their peers.</p>'
    rows = ["<table><tr><th>#</th><th>category</th><th>rank</th><th>host</th><th>function</th>"
            "<th>impact ms/step</th><th>if fixed</th><th>victims</th><th>action</th></tr>"]
    for i, f in enumerate(findings, 1):
        rows.append(f"<tr><td>{i}</td><td class=cat>{_e(f.get('category'))}</td>"
                    f"<td>{_e(ranks_text(f))}</td>"
                    f"<td>{_e(f.get('host') or '–')}</td><td>{_e(f.get('function') or '–')}</td>"
                    f"<td>{_e(impact_text(f)) if f.get('category') == 'hang' else _num(f.get('impact_ms_per_step'))}"
                    f"</td><td>{_e(if_fixed_text(f) or '–')}</td>"
                    f"<td>{len(f.get('victims') or [])}</td>"
                    f"<td>{_e(f.get('action', ''))}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _drill(drill: dict[str, Any]) -> str:
    """The named ranks in detail: each window step, and what the rank spent its time in."""
    out = []
    step_cols = ("step", "ms", "cpu", "runq", "data", "gc", "comm")
    step_heads = ("step", "wall ms", "thread CPU ms", "run queue ms", "data loader ms", "GC ms",
                  "in collectives ms")
    for rank, r in drill.items():
        if not isinstance(r, dict):
            continue
        dev = r.get("device") if isinstance(r.get("device"), dict) else {}
        where = ", ".join(x for x in (f"host {r.get('host')}" if r.get("host") else "",
                                      f"pid {r.get('pid')}" if r.get("pid") is not None else "",
                                      str(dev.get("name") or "")) if x)
        out.append(f"<h3>rank {_e(rank)} in detail ({_e(where)})</h3>")
        steps = [s for s in r.get("steps") or [] if isinstance(s, dict)]
        if steps:
            out.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in step_heads) + "</tr>" + "".join(
                "<tr>" + "".join(f"<td>{_e(s['step']) if c == 'step' else _num(s.get(c))}</td>"
                                 for c in step_cols) + "</tr>" for s in steps) + "</table>")
        hist = r.get("history") if isinstance(r.get("history"), dict) else {}
        ms = hist.get("ms") if isinstance(hist.get("ms"), list) else []
        if ms:
            out.append(f"<p class=muted>The {len(ms)} steps before the window (from step "
                       f"{_e(hist.get('first'))}), wall ms: " + " ".join(_num(m, ".0f") for m in ms) + "</p>")
        fns = [f for f in r.get("functions") or [] if isinstance(f, dict)]
        if fns:
            out.append(f"<p>Its {len(fns)} functions with the most self time (of "
                       f"{_e(r.get('functions_listed', len(fns)))} listed), ms per step:</p>"
                       "<table><tr><th>function</th><th>phase</th><th>kind</th><th>calls</th><th>total</th>"
                       "<th>self</th></tr>" + "".join(
                           f"<tr><td>{_e(f.get('name'))}</td><td>{_e(f.get('phase'))}</td><td>{_e(f.get('kind'))}"
                           f"</td><td>{_num(f.get('count'))}</td><td>{_num(f.get('ms'), '.2f')}</td>"
                           f"<td>{_num(f.get('self'), '.2f')}</td></tr>" for f in fns) + "</table>")
    return "".join(out)


def _brief_steps(diagnoses: list[dict[str, Any]]) -> list[Any]:
    """Steps of the captures shown in one row each: found healthy (``report.is_healthy``), not the
    baseline, and older than the newest FULL_HEALTHY such captures. Why: a job that runs for days is captured every refill period, and
    each capture's section (its ranks × phases heatmap) is 5-20 KB: a thousand healthy ones made
    report.html tens of MB that say nothing the timeline does not."""
    healthy = [d for d in diagnoses if d.get("trigger") != "baseline" and is_healthy(d)]
    return [d.get("step") for d in healthy[:-FULL_HEALTHY]] if len(healthy) > FULL_HEALTHY else []


def render_html(report: dict[str, Any], diagnoses: list[dict[str, Any]],
                steps: dict[str, list] | None) -> str:
    """The whole page as a string."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>eroica report</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>eroica report — world size {_e(report.get('world_size'))}, "
             f"{_e(report.get('steps'))} step{'' if report.get('steps') == 1 else 's'}, "
             f"{len(report.get('captures') or [])} capture(s)</h1>",
             "<h2>Findings (job, by impact)</h2>", _finding_rows(report.get("findings") or [])]
    slower = [c.get("step") for c in report.get("captures") or [] if isinstance(c, dict) and slower_text(c)]
    if slower and not report.get("findings"):
        # the text report's head says the same: no culprit, but not healthy either
        parts[-1] = (f'<p class="cat">No findings, but the capture(s) at step(s) {_e(", ".join(map(str, slower)))} '
                     "were slower than the baseline with no culprit found (below).</p>")
    held = job_held_text(report.get("job"))
    if held and not slower and not report.get("findings"):
        parts[-1] = f'<p class="cat">No findings, but {_e(held)} (below).</p>'
    stood = stood_down_text(report)
    if stood:
        parts[-1] = f'<p class="cat">{_e(stood[0].upper() + stood[1:])}.</p>'
    transient = transient_lines(report)
    if transient:
        parts.append("<h3>Transient (not findings)</h3>" + "".join(f"<p>{_e(line.strip())}</p>" for line in transient))
    job = report.get("job") or {}
    if job:
        scalars = {k: v for k, v in job.items() if not isinstance(v, (list, dict))}
        parts.append("<h3>Job</h3><table>" + "".join(
            f"<tr><th>{_e(k)}</th><td>{_e(_cell(v))}</td></tr>" for k, v in list(scalars.items())[:40])
            + "</table>")
        lost = format_time_lost(job.get("time_lost"))
        if lost:
            parts.append(f"<p>{_e(lost.strip())}</p>")
        caps = job.get("captures_taken") or []
        if caps:
            parts.append("<p>Captures: " + ", ".join(_e(capture_label(c)) for c in caps[:50] if isinstance(c, dict))
                         + "</p>")
        held = job_profiler_text(job.get("job_profiler")).strip()
        if held:
            parts.append(f"<p>{_e(held[0].upper() + held[1:])}</p>")
        anomaly = settings.anomaly_text(job.get("anomaly_ranks"), int(job.get("world_size") or 0)).strip()
        if anomaly:
            parts.append(f'<p class="cat">{_e(anomaly[0].upper() + anomaly[1:])}</p>')
        steady = steadywork.SteadyWork.from_json(job.get("steady_work"))
        if steady is not None:
            line = steadywork.format_steady_work(steady).strip()
            parts.append(f'<p class="cat">{_e(line[0].upper() + line[1:])}</p>')
        turns = imbalance.Imbalance.from_json(job.get("imbalance"))
        if turns is not None:
            line = imbalance.format_imbalance(turns).strip()
            parts.append(f'<p class="cat">{_e(line[0].upper() + line[1:])}</p>')
        late = launchskew.LaunchSkew.from_json(job.get("launch"))
        if late is not None:
            line = launchskew.format_launch_skew(late).strip()
            parts.append(f'<p class="cat">{_e(line[0].upper() + line[1:])}</p>')
        starts = epochs.EpochStarts.from_json(job.get("epoch_starts"))
        if starts is not None:
            line = epochs.format_epoch_starts(starts).strip()
            parts.append(f"<p>{_e(line[0].upper() + line[1:])}</p>")
        refused = refused_summary(job.get("captures_refused")).strip()
        if refused:
            parts.append(f'<p class="cat">{_e(refused[0].upper() + refused[1:])}</p>')
        long = [s for s in job.get("long_steps") or [] if isinstance(s, dict)]
        if long:
            parts.append("<h3>Longest steps</h3><ul>" + "".join(
                f"<li>{_e(line)}</li>" for line in longsteps.format_long_steps(
                    [longsteps.LongStep.from_json(s) for s in long[:10]]))
                + "</ul>")
        per_rank = [r for r in job.get("per_rank") or [] if isinstance(r, dict)]
        if per_rank:
            cols = ["rank", "host", "steps", "median_ms", "p99_ms", "eroica_ms"]
            parts.append("<h3>Ranks (step time after warm-up)</h3><table><tr>"
                         + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + "".join(
                             "<tr>" + "".join(f"<td>{_e(_cell(r.get(c)))}</td>" for c in cols) + "</tr>"
                             for r in per_rank[:64]) + "</table>"
                         + (f"<p>… {len(per_rank) - 64} more ranks in report.json</p>" if len(per_rank) > 64 else ""))
    parts += ["<h2>Step time</h2>", _timeline(steps, report.get("captures") or [])]
    brief = set(_brief_steps(diagnoses))
    if brief:
        rows = [d for d in diagnoses if d.get("step") in brief]
        parts.append(f"<h2>{len(rows)} earlier captures found healthy</h2><p class=muted>Each in one row (the "
                     f"newest {FULL_HEALTHY} healthy captures, the baseline and every other capture are shown in "
                     "full below; every capture is in full in its diagnosis-&lt;step&gt;.json).</p><table><tr>"
                     "<th>step</th><th>trigger</th><th>ranks</th><th>median step ms</th></tr>" + "".join(
                         f"<tr><td>{_e(d.get('step'))}</td><td>{_e(d.get('trigger'))}</td><td>"
                         f"{_e(d.get('ranks_analysed'))}/{_e(d.get('world_size'))}</td><td>"
                         f"{_e(_cell((d.get('step_ms') or {}).get('median')))}</td></tr>" for d in rows)
                     + "</table>")
    for d in diagnoses:
        if d.get("step") in brief:
            continue
        parts.append(f"<h2>Capture at step {_e(d.get('step'))} ({_e(d.get('trigger'))}) — "
                     f"{_e(d.get('ranks_analysed'))}/{_e(d.get('world_size'))} ranks</h2>")
        slower, passing, once = slower_text(d), passing_text(d), one_off_text(d)
        parts.append(f'<p class="cat">A one-off stall, no steady culprit: {_e(once)}.</p>' if once
                     else f'<p class="cat">Slower, no culprit found: {_e(slower)}.</p>' if slower
                     else f'<p class="cat">A passing slowdown, no finding: {_e(passing)}.</p>' if passing
                     else _finding_rows(d.get("findings") or []))
        for f in (d.get("findings") or [])[:3]:
            fns = (f.get("evidence") or {}).get("functions") or []
            if fns:
                who = f"rank {f['rank']}" if f.get("rank") is not None else f.get("category", "")
                versus = "baseline" if "now_ms" in fns[0] else "peers"   # a regression, a rank without peers
                parts.append(f"<h3>{_e(who)}: functions vs {versus}</h3>{_bars(fns)}")
        if isinstance(d.get("drill_down"), dict) and d["drill_down"]:
            parts.append(_drill(d["drill_down"]))
        if d.get("missing"):
            parts.append(f"<p>Missing ranks: {_e(', '.join(map(str, d['missing'][:64])))}</p>")
        if d.get("errors"):
            parts.append("<ul>" + "".join(f"<li>{_e(e)}</li>" for e in d["errors"][:32]) + "</ul>")
        if d.get("notes"):
            parts.append("<p class=muted>" + "<br>".join(_e(n) for n in d["notes"]) + "</p>")
        parts.append("<h3>Ranks × phases (ms per step)</h3><p class=muted>Red: above the column's median, "
                     "blue: below (a culprit's grown phase is red, its short wait blue).</p>"
                     + _heatmap(d.get("phase_table") or {}))
    parts.append("</body></html>")
    return "\n".join(parts)
