"""The topology pictures' palette and text helpers, shared by :mod:`.svg` and :mod:`.text`.

The colours are the report's (``labctl.report.charts`` and the CSS variables
of ``labctl.report.html``), so the picture sits in ``report.html`` as if
drawn by it; they are written out here because the report imports this
package, not the other way round.
"""

from __future__ import annotations

import re
from html import escape

BAR_COLOR = "#3b6ea8"
FAILED_COLOR = "#b42318"
GRID_COLOR = "#e3e7ee"
INK = "#1f2933"
MUTED = "#6b7785"
CARD = "#ffffff"
HEAD = "#eef2f7"
BAD_BG = "#fdecea"
GOOD = "#17803d"
WARN = "#8a5a00"
FONT = "system-ui, sans-serif"
CHAR_WIDTH = 6.8  # rough width of one 12 px sans-serif character

XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
"""Characters XML forbids (dropped from every label)."""


def xml_text(text: object) -> str:
    """``text`` escaped for XML text and attribute values (characters XML forbids dropped)."""
    return escape(XML_BAD.sub("", str(text)), quote=True)


def short(text: str, chars: float) -> str:
    """``text`` cut to about ``chars`` characters, with an ellipsis when cut."""
    limit = max(int(chars), 2)
    return text if len(text) <= limit else text[: limit - 1] + "…"
