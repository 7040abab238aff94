"""Text from guests, consoles and files made safe to print on a terminal.

A guest controls what it writes on its console, in its command output and in
its READY line; a bundle's files can come from anyone. Printed raw, an
``ESC ]0;...`` retitles the terminal, ``ESC [2J`` clears it, and a C1 ``CSI``
(``\\x9b``) or an OSC can do worse on some terminals. :func:`safe_text` makes
every such character visible instead:

* C0 controls (``\\x00``-``\\x1f``) except tab, ESC, DEL and C1 controls
  (``\\x80``-``\\x9f``) are shown as ``\\xNN`` (``\\x1b``, ``\\x07``, ``\\x0d``);
* newline is kept where the text has line structure (``multiline=True``, the
  default; ``"\\r\\n"`` counts as one newline there) and shown as ``\\x0a`` in
  text meant to be one line;
* the Unicode bidirectional overrides and isolates (U+202A-U+202E,
  U+2066-U+2069, the "Trojan Source" characters) are shown as ``\\uNNNN``.

Everything else, tab and other non-ASCII text included, is kept. Backslashes
are not doubled: the result is for reading, not for decoding back.

The CLI applies this at its printing boundary (:mod:`labctl.cli.ui`); library
code that builds a message from guest text may apply it too (it is idempotent).
What a user's own command prints through ``labctl exec`` and ``labctl ssh``
is passed through byte for byte, as ``ssh`` does.
"""

from __future__ import annotations

import re

_BIDI = "\u202a-\u202e\u2066-\u2069"
# Everything escaped, newline included (one-line text) or not.
_ONE_LINE = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_BIDI}]")
_MULTILINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe_text(text: str, multiline: bool = True) -> str:
    """``text`` with control characters shown as visible escapes (see the module's docstring)."""
    if multiline:
        if "\r\n" in text:
            text = text.replace("\r\n", "\n")
        return _MULTILINE.sub(_escape, text)
    return _ONE_LINE.sub(_escape, text)


def safe_line(text: str) -> str:
    """``text`` as one line: :func:`safe_text` with newlines escaped too."""
    return safe_text(text, multiline=False)


def is_safe(text: str, multiline: bool = True) -> bool:
    """Whether ``text`` has nothing :func:`safe_text` would escape."""
    return (_MULTILINE if multiline else _ONE_LINE).search(text) is None and not (multiline and "\r\n" in text)
