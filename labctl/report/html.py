"""The report's document model as one self-contained HTML page (``report.html``).

Inline CSS and SVG, no scripts, no URLs, and a Content-Security-Policy that
forbids fetching anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from urllib.parse import quote

from labctl import __version__
from labctl.report.document import (
    Block,
    Bullets,
    Charts,
    Graphic,
    Heading,
    Inline,
    Meta,
    Para,
    Picture,
    Pre,
    Section,
    Span,
    Table,
)
from labctl.report.flamegraph import SCRIPT, script_csp_source

CSS = """
:root { --ink: #1f2933; --muted: #6b7785; --line: #d9dee6; --bg: #f4f6f9; --card: #ffffff;
        --accent: #3b6ea8; --bad: #b42318; --bad-bg: #fdecea; --good: #17803d; --head: #eef2f7; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 28px 32px 48px; }
h1 { font-size: 28px; margin: 0 0 10px; letter-spacing: -0.01em; }
h2 { font-size: 21px; margin: 36px 0 14px; padding-bottom: 6px; border-bottom: 2px solid var(--line); }
h3 { font-size: 18px; margin: 0 0 12px; }
h4 { font-size: 12.5px; margin: 20px 0 6px; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); }
p { margin: 10px 0; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
pre.text { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px;
           background: var(--head); padding: 8px 12px; border-radius: 6px; overflow-x: auto; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px;
       background: var(--head); padding: 1px 5px; border-radius: 4px; overflow-wrap: anywhere; }
.table-wrap { overflow-x: auto; border: 1px solid var(--line); border-radius: 8px; background: var(--card); }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { padding: 7px 12px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
tbody tr:last-child td { border-bottom: none; }
th { background: var(--head); font-weight: 600; font-size: 13px; white-space: nowrap; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) td { background: #fafbfd; }
tr.failed td, tbody tr.failed:nth-child(even) td { background: var(--bad-bg); }
table.commands td:nth-child(3) { width: 55%; }
.alert { background: var(--bad-bg); border-left: 5px solid var(--bad); padding: 10px 16px; border-radius: 6px;
         white-space: pre-line; }
ul.alert { list-style: none; white-space: normal; }
ul.alert li { margin: 3px 0; }
p.ok { display: inline-block; background: #e7f5ec; border-left: 5px solid var(--good); padding: 6px 16px;
       border-radius: 6px; margin: 4px 0; }
.callout { background: #e9f1fb; border-left: 5px solid var(--accent); padding: 12px 16px; border-radius: 6px;
           font-size: 16px; margin: 16px 0; }
.bad { color: var(--bad); font-weight: 600; }
.good { color: var(--good); font-weight: 600; }
.muted { color: var(--muted); }
dl.meta { display: grid; grid-template-columns: repeat(auto-fill, minmax(250px, 1fr)); gap: 10px 28px;
          margin: 16px 0; padding: 14px 18px; background: var(--card); border: 1px solid var(--line);
          border-radius: 8px; }
dl.meta div { min-width: 0; }
dt { font-size: 11.5px; color: var(--muted); text-transform: uppercase; letter-spacing: .06em; }
dd { margin: 0; overflow-wrap: anywhere; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px; margin-top: 18px; }
.charts figure { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
                 padding: 14px 16px 8px; }
svg.chart { display: block; max-width: 100%; height: auto; }
figure.topology { margin: 12px 0 8px; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
                  padding: 10px 12px; overflow-x: auto; }
section.step { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 18px 22px;
               margin: 18px 0; }
section.step.failed { border: 2px solid var(--bad); box-shadow: 0 0 0 3px var(--bad-bg); }
section.step dl.meta { background: var(--bg); border: none; }
section.step .table-wrap { border-radius: 6px; }
ul.artifacts { columns: 2 320px; column-gap: 32px; padding-left: 20px; font-size: 13.5px; margin: 6px 0; }
ul.artifacts li { break-inside: avoid; }
ul.warnings li { color: #8a5a00; }
footer { margin-top: 40px; color: var(--muted); font-size: 13px; }
figure.graphic { margin: 14px 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
                 padding: 10px 12px; }
.graphic-wrap { overflow-x: auto; }
.graphic-wrap svg { display: block; max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 6px; }
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; base-uri 'none'"


def html_span(span: Span) -> str:
    text = escape(span.text)
    inner = {"b": "<strong>{}</strong>", "code": "<code>{}</code>", "bad": '<span class="bad">{}</span>',
             "good": '<span class="good">{}</span>', "muted": '<span class="muted">{}</span>'}.get(
                 span.style, "{}").format(text)
    return f'<a href="{escape(quote(span.href))}">{inner}</a>' if span.href else inner


def html_inline(spans: Inline) -> str:
    return "".join(html_span(s) for s in spans)


def _cls(cls: str) -> str:
    return f' class="{escape(cls)}"' if cls else ""


def html_table(table: Table) -> str:
    def cell(tag: str, i: int, content: str) -> str:
        return f"<{tag}{_cls('num' if i in table.numeric else '')}>{content}</{tag}>"

    head = "".join(cell("th", i, escape(h)) for i, h in enumerate(table.headers))
    body = "\n".join(f"<tr{_cls(row.cls)}>" + "".join(cell("td", i, html_inline(c)) for i, c in enumerate(row.cells))
                     + "</tr>" for row in table.rows)
    return (f'<div class="table-wrap"><table{_cls(table.cls)}>\n<thead><tr>{head}</tr></thead>\n'
            f"<tbody>\n{body}\n</tbody></table></div>")


def html_block(block: Block) -> str:
    """One block as HTML."""
    if isinstance(block, Heading):
        return f"<h{block.level}>{escape(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        return f"<p{_cls(block.cls)}>{html_inline(block.spans)}</p>"
    if isinstance(block, Bullets):
        return f"<ul{_cls(block.cls)}>\n" + "\n".join(f"<li>{html_inline(i)}</li>" for i in block.items) + "\n</ul>"
    if isinstance(block, Meta):
        rows = "\n".join(f"<div><dt>{escape(k)}</dt><dd>{html_inline(v)}</dd></div>" for k, v in block.rows)
        return f'<dl class="meta">\n{rows}\n</dl>'
    if isinstance(block, Table):
        return html_table(block)
    if isinstance(block, Charts):
        return '<div class="charts">\n' + "\n".join(f"<figure>\n{svg}\n</figure>" for svg in block.svgs) + "\n</div>"
    if isinstance(block, Graphic):
        link = f' <a href="{escape(quote(block.href))}">{escape(block.href)}</a>' if block.href else ""
        return (f'<figure class="graphic">\n<div class="graphic-wrap">{block.svg}</div>\n'
                f"<figcaption>{html_inline(block.caption)}{link}</figcaption>\n</figure>")
    if isinstance(block, Picture):
        return f'<figure class="topology">\n{block.svg}\n</figure>'
    if isinstance(block, Pre):
        return f'<pre class="text">{escape(block.text)}</pre>'
    anchor = f' id="{escape(block.anchor)}"' if block.anchor else ""
    return f"<section{_cls(block.cls)}{anchor}>\n" + "\n".join(html_block(b) for b in block.blocks) + "\n</section>"


def _scripted(blocks: Sequence[Block]) -> bool:
    return any((isinstance(b, Graphic) and b.script) or (isinstance(b, Section) and _scripted(b.blocks))
               for b in blocks)


def to_html(blocks: Sequence[Block], title: str) -> str:
    """The report as one self-contained HTML page.

    Without flame graphs it has no script at all; with them, the one flame
    graph script (search, zoom), allowed by its hash in the page's CSP.
    """
    body = "\n".join(html_block(b) for b in blocks)
    csp, script = CSP, ""
    if _scripted(blocks):
        csp = f"{CSP}; script-src {script_csp_source()}"
        script = f"<script>{SCRIPT}</script>\n"
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<meta name="generator" content="labctl {escape(__version__)}">\n'
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n{body}\n"
            f"<footer>Generated by labctl {escape(__version__)}.</footer>\n</main>\n{script}</body>\n</html>\n")
