"""The report as ONE self-contained HTML file: inline CSS, inline SVG charts drawn here, a few
lines of inline JS (hover read-outs), the data as JSON in the page. No CDN, no font, no
request: it opens from a mail attachment on a machine with no network.

Every number a reader checks has a `data-metric` attribute (`pages`, `items`, `errors`, ...),
so a test (or a script) reads the page's numbers without scraping text.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from monitor.report.data import errors, pages

CSS = """
:root{--fg:#1d2430;--muted:#5f6b7a;--line:#d8dee6;--bg:#f6f8fa;--a:#2f6fdb;--b:#1f9d6b;--c:#d64545;--d:#b8860b}
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);margin:0;background:var(--bg)}
header{background:#fff;border-bottom:1px solid var(--line);padding:16px 28px}h1{font-size:20px;margin:0 0 4px}
main{padding:20px 28px;display:grid;gap:18px;grid-template-columns:repeat(auto-fit,minmax(460px,1fr))}
section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:14px 16px}
section.wide{grid-column:1/-1}h2{font-size:15px;margin:0 0 10px}.muted{color:var(--muted)}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{flex:1 1 120px;border:1px solid var(--line);border-radius:6px;padding:10px 12px}
.card b{display:block;font-size:22px}table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);font-variant-numeric:tabular-nums}
td.n,th.n{text-align:right}svg text{font-size:11px;fill:var(--muted)}.legend span{margin-right:14px}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
#readout{position:fixed;pointer-events:none;background:#1d2430;color:#fff;padding:3px 7px;border-radius:4px;font-size:12px;display:none}
"""

JS = """
document.querySelectorAll('[data-tip]').forEach(function(el){
  el.addEventListener('mousemove',function(e){var r=document.getElementById('readout');
    r.textContent=el.getAttribute('data-tip');r.style.display='block';
    r.style.left=(e.clientX+12)+'px';r.style.top=(e.clientY+12)+'px';});
  el.addEventListener('mouseleave',function(){document.getElementById('readout').style.display='none';});
});
"""

COLORS = ("var(--a)", "var(--b)", "var(--c)", "var(--d)")


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t else "-"


def num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.3f}".rstrip("0").rstrip(".")
    return f"{x:,}"


def line_chart(points: Sequence[dict[str, Any]], series: Sequence[str], h: int = 220) -> str:
    """Lines of `series` over `points[i]["t"]`, with axes, ticks, a legend and hover tips."""
    w, left, bottom, top = 900, 52, 26, 10
    if not points:
        return '<p class="muted">no points yet</p>'
    ts = [p["t"] for p in points]
    t0, t1 = min(ts), max(ts)
    span = (t1 - t0) or 1.0
    vmax = max([p[k] for p in points for k in series] + [1])
    magnitude = 10 ** math.floor(math.log10(vmax))
    vmax = math.ceil(vmax / magnitude) * magnitude

    def x(t: float) -> float:
        return left + (w - left - 10) * ((t - t0) / span if t1 > t0 else 0.5)

    def y(v: float) -> float:
        return top + (h - top - bottom) * (1 - v / vmax)

    out = [f'<svg viewBox="0 0 {w} {h}" width="100%" role="img">']
    for i in range(5):
        v = vmax * i / 4
        out.append(
            f'<line x1="{left}" x2="{w - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            f'stroke="#eef1f4"/><text x="{left - 6}" y="{y(v) + 4:.1f}" '
            f'text-anchor="end">{num(round(v, 2))}</text>'
        )
    fmt = "%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%m-%d %H:%M"
    for t, anchor in ((t0, "start"), (t0 + span / 2, "middle"), (t1, "end")):
        label = datetime.fromtimestamp(t, UTC).strftime(fmt)
        out.append(f'<text x="{x(t):.1f}" y="{h - 8}" text-anchor="{anchor}">{label}</text>')
    for k, color in zip(series, COLORS, strict=False):
        path = " ".join(f"{x(p['t']):.1f},{y(p[k]):.1f}" for p in points)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        for p in points:
            tip = f"{when(p['t'])}: {k} {p[k]}"
            out.append(
                f'<circle cx="{x(p["t"]):.1f}" cy="{y(p[k]):.1f}" r="3" fill="{color}" '
                f'data-tip="{esc(tip)}"/>'
            )
    out.append("</svg>")
    legend = "".join(
        f'<span><i class="sw" style="background:{c}"></i>{esc(k)}</span>'
        for k, c in zip(series, COLORS, strict=False)
    )
    return "".join(out) + f'<div class="legend">{legend}</div>'


def bars(rows: Sequence[tuple[str, float]], color: str = "var(--c)") -> str:
    """Horizontal bars, one per (label, value)."""
    if not rows:
        return '<p class="muted">none</p>'
    w, label_w, row_h = 900, 330, 20
    vmax = max(v for _, v in rows) or 1
    out = [f'<svg viewBox="0 0 {w} {row_h * len(rows) + 4}" width="100%" role="img">']
    for i, (label, v) in enumerate(rows):
        y = i * row_h + 2
        bw = (w - label_w - 70) * v / vmax
        out.append(
            f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end">{esc(label)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{bw:.1f}" height="{row_h - 6}" '
            f'fill="{color}" data-tip="{esc(label)}: {num(v)}"/>'
            f'<text x="{label_w + bw + 6:.1f}" y="{y + 14}">{num(v)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def table(
    head: Sequence[str],
    rows: Sequence[Sequence[Any]],
    numeric: set[int] | None = None,
    metric: str = "",
) -> str:
    numeric = numeric if numeric is not None else set(range(1, len(head)))
    th = "".join(
        f'<th class="{"n" if i in numeric else ""}">{esc(h)}</th>' for i, h in enumerate(head)
    )
    body = []
    for r in rows:
        tds = "".join(
            f'<td class="{"n" if i in numeric else ""}">{esc(num(c) if i in numeric else c)}</td>'
            for i, c in enumerate(r)
        )
        body.append(f"<tr>{tds}</tr>")
    if not rows:
        body.append(f'<tr><td colspan="{len(head)}" class="muted">none</td></tr>')
    attr = f' data-table="{esc(metric)}"' if metric else ""
    return f"<table{attr}><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render(data: dict[str, Any]) -> str:
    t = data["totals"]
    sel = data["selection"]
    what = (
        f"run {sel['run']}"
        if sel["run"]
        else f"runs of the last {num(sel['since'] or 86400)} s"
        + (f", site {sel['site']}" if sel["site"] else "")
    )
    cards = "".join(
        f'<div class="card">{esc(label)}<b data-metric="{key}">{num(t[key])}</b></div>'
        for key, label in (
            ("runs", "runs"),
            ("pages", "pages fetched"),
            ("items", "items"),
            ("stored", "items stored"),
            ("errors", "errors"),
            ("failed", "failed for good"),
            ("retried", "retried"),
        )
    )
    win = data["window"]
    note = (
        ""
        if win["fleet_window"]
        else '<p class="muted">No time series covers this window yet (a worker samples one point '
        "a minute): the fleet numbers below are totals since the counters began.</p>"
    )
    runs = table(
        ["run", "chain", "status", "started", "seconds", "pages", "items", "errors"],
        [
            [
                r["run_id"],
                r["chain"],
                r["status"],
                when(r["created"]),
                round(r["elapsed"] or 0, 1),
                pages(r["totals"]),
                r["totals"].get("items", 0),
                errors(r["totals"]),
            ]
            for r in data["runs"]
        ],
        numeric={4, 5, 6, 7},
        metric="runs",
    )
    by_type: dict[str, int] = {}
    by_task: dict[str, int] = {}
    for e in data["errors"]:
        by_type[f"{e['type']} ({e['outcome']})"] = (
            by_type.get(f"{e['type']} ({e['outcome']})", 0) + e["n"]
        )
        by_task[e["task"]] = by_task.get(e["task"], 0) + e["n"]
    errs = (
        f"<h3>by type</h3>{bars(sorted(by_type.items(), key=lambda kv: -kv[1]))}"
        f"<h3>by endpoint</h3>{bars(sorted(by_task.items(), key=lambda kv: -kv[1]))}"
        + table(
            ["endpoint", "error", "outcome", "attempts"],
            [[e["task"], e["type"], e["outcome"], e["n"]] for e in data["errors"]],
            numeric={3},
            metric="errors",
        )
        + "<h3>dead letters of these runs</h3>"
        + table(
            ["endpoint", "error", "tasks"],
            [[d["task"], d["type"], d["n"]] for d in data["dead_letters"]],
            numeric={2},
            metric="dead_letters",
        )
    )
    lat = data["latency"]
    latency = bars(
        [(f"{r['site']} p{p}", (r[f"p{p}"] or 0) * 1000) for r in lat for p in (50, 90, 99)],
        "var(--a)",
    ) + table(
        ["site", "tasks", "p50 ms", "p90 ms", "p99 ms"],
        [
            [r["site"], r["count"], *(round((r[f"p{p}"] or 0) * 1000, 1) for p in (50, 90, 99))]
            for r in lat
        ],
        metric="latency",
    )
    pool_lines = "".join(
        f"<h3>{esc(p['name'])}</h3>"
        + line_chart(
            [{"t": a, "size": s, "banned": b} for a, s, b in p["series"]], ["size", "banned"], 140
        )
        for p in data["pools"]
        if len(p["series"]) > 1
    )
    pools = (
        table(
            ["pool", "size", "banned", "produced", "waits on an empty pool"],
            [
                [p["name"], p["size"], p["bans"], p["produced"], p["exhausted_waits"]]
                for p in data["pools"]
            ],
            metric="pools",
        )
        + pool_lines
    )
    dedup = table(
        ["namespace", "new", "unchanged", "changed", "change rate"],
        [
            [
                d["namespace"],
                d["new"],
                d["unchanged"],
                d["changed"],
                f"{d['change_rate']:.1%}" if d["change_rate"] is not None else "-",
            ]
            for d in data["dedup"]
        ],
        numeric={1, 2, 3},
        metric="dedup",
    )
    payload = orjson.dumps(data).decode().replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>chaincrawl report: {esc(what)}</title><style>{CSS}</style></head>
<body><header><h1>chaincrawl report</h1>
<div class="muted">{esc(what)} · from {esc(when(win["start"]))} to {esc(when(win["end"]))} · generated {esc(when(data["generated"]))}</div></header>
<main>
<section class="wide"><div class="cards">{cards}</div>{note}</section>
<section class="wide"><h2>Pages and items over time</h2>{line_chart(data["timeline"], ["pages", "items", "errors"])}</section>
<section class="wide"><h2>Runs</h2>{runs}</section>
<section><h2>Errors by type and endpoint</h2>{errs}</section>
<section><h2>Task latency percentiles per site (fetch and parse)</h2>{latency}</section>
<section><h2>Resource pools</h2>{pools}</section>
<section><h2>Dedup change rates</h2>{dedup}</section>
</main><div id="readout"></div>
<script type="application/json" id="report-data">{payload}</script>
<script>{JS}</script></body></html>
"""
