"""KTAP / TAP 13 output (the kernel's selftests, KUnit) into results: pure parsing.

A document is a version line (``TAP version 13``, ``KTAP version 1``), a plan (``1..N``)
and result lines ``ok N description`` / ``not ok N description``, each optionally with a
directive after ``#``: ``SKIP reason``, ``XFAIL reason``, ``TODO``, or anything else
(``# TIMEOUT 45 seconds``, ``# exit=1``: kept as the reason). The lines *before* a result
line belong to that test: its log. A test's log may hold a nested document, one level
deeper in either of the two ways the kernel writes it:

* prefixed by ``# `` (kselftest's runner prefixes everything a test prints, so a
  kselftest_harness program's own TAP arrives as ``# ok 3 tls.12_aes_gcm.sends``);
* indented by four spaces (KTAP v1, as KUnit writes subtests).

A nested document is parsed the same way, to any depth. Lines that are none of these
are diagnostics. ``Bail out!`` ends a document (the tests its plan promised but that never
reported count as missing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

PASS, FAIL, SKIP, XFAIL = "pass", "fail", "skip", "xfail"
RESULTS = (PASS, FAIL, SKIP, XFAIL)

_RESULT = re.compile(r"(?P<not>not )?ok\s+(?P<num>\d+)(?:\s+-)?(?:\s+(?P<rest>.*))?$")
_PLAN = re.compile(r"1\.\.(\d+)(?:\s*#.*)?$")
_VERSION = re.compile(r"K?TAP version \d+$")
_DIRECTIVE = re.compile(r"(?P<desc>.*?)\s*(?<!\\)#\s*(?P<dir>[A-Za-z]+)?(?P<text>.*)$")
_KSELFTEST_NAME = re.compile(r"selftests:\s*(?P<collection>\S+):\s*(?P<test>\S+)$")
_NEST_PREFIXES = ("# ", "    ")


@dataclass
class TapResult:
    """One test: ``ok`` as written, its ``directive`` (``SKIP``, ``XFAIL``, ``TODO``, '' or
    another word), the directive's text or a failure's note (``reason``), the lines it printed
    before its result (``log``) and its ``subtests`` (a nested document), if any."""

    number: int | None
    name: str
    ok: bool
    directive: str = ""
    reason: str = ""
    log: list[str] = field(default_factory=list)
    subtests: list[TapResult] = field(default_factory=list)
    plan: int | None = None  # the nested document's plan

    @property
    def result(self) -> str:
        """pass, fail, skip or xfail (a SKIP is a skip whether ``ok`` or ``not ok``; ``not ok # TODO`` is an xfail)."""
        if self.directive == "SKIP":
            return SKIP
        if self.directive == "XFAIL" or (self.directive == "TODO" and not self.ok):
            return XFAIL
        return PASS if self.ok else FAIL

    def skip_reason(self) -> str:
        """Why it skipped: the directive's text, else the last line of its log that says SKIP, else its last line."""
        if self.reason:
            return self.reason
        own = [ln for ln in self.log if ln.strip("# ") and not ln.lstrip("# ").startswith(("ok ", "not ok ", "selftests: "))]
        said = [ln for ln in own if "skip" in ln.lower()]
        lines = said or own
        return lines[-1].lstrip("# ").strip() if lines else ""

    def to_dict(self) -> TapRecord:
        return {"number": self.number, "name": self.name, "result": self.result, "directive": self.directive,
                "reason": self.reason, "subtests": [s.to_dict() for s in self.subtests]}


class TapRecord(TypedDict):
    """A result as JSON (:meth:`TapResult.to_dict`), its subtests nested."""

    number: int | None
    name: str
    result: str  # pass, fail, skip or xfail
    directive: str
    reason: str
    subtests: list[TapRecord]


@dataclass
class TapDocument:
    version: str | None = None
    plan: int | None = None
    results: list[TapResult] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)  # lines after the last result (no test owns them)
    bailed: str | None = None  # the Bail out! line's text

    @property
    def missing(self) -> int:
        """Tests the plan promised that never reported."""
        return max(0, (self.plan or 0) - len(self.results))


def _result_line(line: str) -> TapResult | None:
    m = _RESULT.match(line)
    if m is None:
        return None
    rest = m["rest"] or ""
    name, directive, reason = rest, "", ""
    d = _DIRECTIVE.match(rest)
    if d is not None:
        name = d["desc"]
        word = (d["dir"] or "").upper()
        if word in ("SKIP", "XFAIL", "TODO"):
            directive, reason = word, d["text"].strip()
        else:
            directive, reason = word, ((d["dir"] or "") + d["text"]).strip()
    return TapResult(int(m["num"]), name.strip(), m["not"] is None, directive, reason)


def _unnest(lines: Sequence[str]) -> list[str] | None:
    """``lines`` one level down, when they hold a nested document (a result line once the
    prefix is taken off), else None. Lines without the prefix stay diagnostics of the level above."""
    for prefix in _NEST_PREFIXES:
        inner = [ln[len(prefix):] for ln in lines if ln.startswith(prefix)]
        if any(_RESULT.match(ln) for ln in inner):
            return [ln[len(prefix):] if ln.startswith(prefix) else "# " + ln.lstrip("#").lstrip()
                    for ln in lines if ln.startswith(prefix) or ln.strip() not in ("", "#")]
    return None


def parse(lines: Iterable[str]) -> TapDocument:
    """The document in ``lines`` (a whole output: text before the version line is a diagnostic)."""
    doc = TapDocument()
    pending: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if doc.bailed is not None:
            doc.diagnostics.append(line)
            continue
        stripped = line.strip()
        if _VERSION.fullmatch(stripped) and line == stripped and not doc.results and doc.version is None:
            doc.version = stripped
            continue
        if line == stripped and _PLAN.match(stripped) and doc.plan is None:
            doc.plan = int(_PLAN.match(stripped)[1])  # type: ignore[index]
            continue
        if line.startswith("Bail out!"):
            doc.bailed = line[len("Bail out!"):].strip()
            continue
        result = _result_line(line) if line == line.lstrip() else None
        if result is None:
            pending.append(line)
            continue
        result.log = pending
        inner = _unnest(pending)
        if inner is not None:
            sub = parse(inner)
            result.subtests, result.plan = sub.results, sub.plan
        pending = []
        doc.results.append(result)
    doc.diagnostics.extend(pending)
    return doc


def parse_text(text: str) -> TapDocument:
    return parse(text.splitlines())


def kselftest_name(description: str) -> tuple[str | None, str]:
    """``(collection, test)`` of a kselftest runner's description (``selftests: net: tls``), else (None, description)."""
    m = _KSELFTEST_NAME.search(description)
    return (m["collection"], m["test"]) if m else (None, description)


def counts(results: Iterable[TapResult]) -> dict[str, int]:
    """How many results are pass, fail, skip and xfail."""
    out = dict.fromkeys(RESULTS, 0)
    for r in results:
        out[r.result] += 1
    return out


def walk(results: Iterable[TapResult]) -> Iterable[TapResult]:
    """Every result and, after each, its subtests, depth first."""
    for r in results:
        yield r
        yield from walk(r.subtests)
