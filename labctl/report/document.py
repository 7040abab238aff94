"""The report's document model: headings, paragraphs, tables, charts...

One model, rendered twice (:mod:`labctl.report.markdown`, :mod:`labctl.report.html`),
so that the two reports always say the same thing. Pure data; imports
nothing of labctl but the number formatting of :mod:`labctl.report.charts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labctl.bundle import fmt_num


@dataclass(frozen=True)
class Span:
    """A run of inline text; ``style`` is '', 'b', 'code', 'bad', 'good' or 'muted'."""

    text: str
    style: str = ""
    href: str | None = None  # relative to the run directory


Inline = tuple[Span, ...]


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    spans: Inline
    cls: str = ""  # '', 'alert', 'callout', 'ok', 'muted'


@dataclass(frozen=True)
class Bullets:
    items: tuple[Inline, ...]
    cls: str = ""


@dataclass(frozen=True)
class Meta:
    rows: tuple[tuple[str, Inline], ...]


@dataclass(frozen=True)
class Row:
    cells: tuple[Inline, ...]
    cls: str = ""  # '' or 'failed'


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[Row, ...]
    numeric: frozenset[int] = field(default_factory=frozenset)
    cls: str = ""


@dataclass(frozen=True)
class Charts:
    svgs: tuple[str, ...]


@dataclass(frozen=True)
class Graphic:
    """A drawing inlined in the HTML report (a flame graph's ``<svg>``), linked from the Markdown one.

    ``svg`` is well-formed inline SVG; ``script`` says it needs the page's
    one flame graph script (:data:`labctl.report.flamegraph.SCRIPT`); ``href`` is the
    same drawing as a file in the bundle.
    """

    svg: str
    caption: Inline
    href: str | None = None
    script: bool = False


@dataclass(frozen=True)
class Picture:
    """A drawing: ``svg`` (inline, no xmlns) for HTML, ``mermaid`` (a Mermaid flowchart) for Markdown."""

    svg: str
    mermaid: str


@dataclass(frozen=True)
class Pre:
    """Lines shown as they are, in a fixed-width font (a stack, a kernel log)."""

    text: str


@dataclass(frozen=True)
class Section:
    blocks: tuple[Block, ...]
    cls: str = ""
    anchor: str | None = None


Block = Heading | Para | Bullets | Meta | Table | Charts | Graphic | Picture | Pre | Section


def txt(text: object, style: str = "") -> Inline:
    """One span of text."""
    return (Span(str(text), style),)


def num(value: object) -> Inline:
    """A figure, muted when it was not measured."""
    return (Span(fmt_num(value), "muted" if value is None else ""),)


