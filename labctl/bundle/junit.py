"""JUnit XML, the results file CI systems read (``labctl run --junit``, ``labctl check --junit``).

One ``<testsuite>`` per lab in a ``<testsuites>`` root, one ``<testcase>`` per step variant
(and run of a ``repeat:`` step) or per graded check and guest: ``<failure message=...>``
with the reason (and, for a step, where its files are in the bundle), ``<error>`` for what
could not run at all (a guest without SSH, a lab that did not come up), ``<skipped>`` for
skipped steps; times in seconds. This is the schema Jenkins, GitLab and the GitHub
Actions JUnit reporters read (the ``junit-10.xsd`` shape: counts on each suite, one of
``failure``/``error``/``skipped`` per case at most).

Text from guests may hold anything: characters XML 1.0 cannot carry are written escaped
(``\\x1b``), and the file is written atomically (:func:`labctl.paths.atomic_write`).
"""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl import paths

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
MAX_TEXT = 64 << 10  # characters of a failure's body kept (the tail)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class Case:
    """One test case: ``status`` is passed, failed, error or skipped; ``message`` the one-line
    reason, ``details`` the body of the failure (or error), ``output`` its ``system-out``."""

    name: str
    classname: str
    status: str = PASSED
    time: float = 0.0
    message: str = ""
    details: str = ""
    output: str = ""


@dataclass(frozen=True)
class Suite:
    name: str
    cases: Sequence[Case]
    timestamp: str | None = None  # ISO 8601, when the suite started
    properties: Mapping[str, str] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for c in self.cases if c.status == status)

    @property
    def time(self) -> float:
        return sum(c.time for c in self.cases)


def xml_text(text: object) -> str:
    """``text`` with every character XML 1.0 cannot carry (controls, lone surrogates) shown as ``\\xNN``."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        str(text))


def _tail(text: str) -> str:
    return text if len(text) <= MAX_TEXT else "[...]\n" + text[-MAX_TEXT:]


def _seconds(t: float) -> str:
    return f"{max(t, 0.0):.3f}"


def to_xml(suites: Sequence[Suite]) -> bytes:
    """The JUnit document for ``suites``."""
    root = ET.Element("testsuites", {
        "name": xml_text(suites[0].name if len(suites) == 1 else "labctl"),
        "tests": str(sum(len(s.cases) for s in suites)),
        "failures": str(sum(s.count(FAILED) for s in suites)),
        "errors": str(sum(s.count(ERROR) for s in suites)),
        "time": _seconds(sum(s.time for s in suites)),
    })
    host = socket.gethostname()
    for i, s in enumerate(suites):
        attrs = {"name": xml_text(s.name), "tests": str(len(s.cases)), "failures": str(s.count(FAILED)),
                 "errors": str(s.count(ERROR)), "skipped": str(s.count(SKIPPED)), "time": _seconds(s.time),
                 "id": str(i), "hostname": xml_text(host)}
        if s.timestamp:
            attrs["timestamp"] = s.timestamp
        suite = ET.SubElement(root, "testsuite", attrs)
        if s.properties:
            props = ET.SubElement(suite, "properties")
            for k, v in s.properties.items():
                ET.SubElement(props, "property", {"name": xml_text(k), "value": xml_text(v)})
        for c in s.cases:
            case = ET.SubElement(suite, "testcase", {"name": xml_text(c.name), "classname": xml_text(c.classname),
                                                    "time": _seconds(c.time)})
            if c.status in (FAILED, ERROR):
                tag = "failure" if c.status == FAILED else "error"
                el = ET.SubElement(case, tag, {"message": xml_text(c.message), "type": tag})
                el.text = xml_text(_tail(c.details or c.message))
            elif c.status == SKIPPED:
                ET.SubElement(case, "skipped", {"message": xml_text(c.message)})
            if c.output:
                ET.SubElement(case, "system-out").text = xml_text(_tail(c.output))
    ET.indent(root)
    return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True)) + b"\n"


def write(path: Path, suites: Sequence[Suite]) -> Path:
    """Write the JUnit document for ``suites`` to ``path`` atomically (readers see all of it or the old file).

    :raise UnsafePath: when the directory is not safe to write into. :raise OSError: when it cannot be written.
    """
    return paths.atomic_write(Path(path), to_xml(suites))


def step_name(result: Mapping[str, Any]) -> str:
    """A step variant's case name: ``step``, ``step[variant]``, ``step[variant]@2`` (run 2 of a ``repeat:``)."""
    name = str(result.get("name", "?"))
    if result.get("variant"):
        name += f"[{result['variant']}]"
    if int(result.get("repeats") or 1) > 1:
        name += f"@{result.get('repeat') or 1}"
    return name


def step_cases(lab: str, results: Iterable[Mapping[str, Any]], bundle: Path | None) -> list[Case]:
    """One case per step variant (a :class:`labctl.steps.result.StepResult` as a dict, as
    ``summary.json`` keeps it): a failed one carries its reason and its directory in the bundle."""
    cases = []
    for r in results:
        status = {"ok": PASSED, "failed": FAILED, "skipped": SKIPPED}.get(str(r.get("status")), ERROR)
        reason = str(r.get("reason") or "")
        where = str(bundle / r["dir"]) if bundle is not None and r.get("dir") else (str(bundle) if bundle else "")
        lines = [reason] if reason else []
        if where:
            lines.append(f"bundle: {where}")
        lines += [f"warning: {w}" for w in r.get("warnings") or []]
        cases.append(Case(name=step_name(r), classname=f"{lab}.steps", status=status,
                          time=float(r.get("duration_s") or 0.0),
                          message=f"{reason} (bundle: {where})" if status in (FAILED, ERROR) and where else reason,
                          details="\n".join(lines)))
    return cases


def selftest_cases(lab: str, results: Iterable[Mapping[str, Any]], bundle: Path | None) -> list[Case]:
    """One case per kernel selftest a ``kselftest:`` step ran (classname ``LAB.STEP[VARIANT]``, name
    ``TARGET:TEST``): a failure with its reason and its log file, a skip with why; XFAIL passes."""
    cases = []
    for r in results:
        record = r.get("kselftest") or {}
        for t in record.get("tests") or []:
            result = str(t.get("result"))
            status = {"pass": PASSED, "xfail": PASSED, "skip": SKIPPED, "fail": FAILED}.get(result, ERROR)
            log = str(bundle / t["log"]) if bundle is not None and t.get("log") else ""
            reason = str(t.get("reason") or "")
            sub = t.get("subtests") or {}
            lines = [f"{result}{': ' + reason if reason else ''}"]
            if sub:
                lines.append("subtests: " + ", ".join(f"{k} {v}" for k, v in sub.items()))
            if t.get("failed_subtests"):
                lines.append("failed subtests: " + ", ".join(map(str, t["failed_subtests"])))
            if log:
                lines.append(f"log: {log}")
            output = ""
            if status == FAILED and bundle is not None and t.get("log"):
                try:
                    output = (bundle / t["log"]).read_text(errors="replace")
                except OSError:
                    output = ""
            message = reason or ("failed" if status == FAILED else "")
            cases.append(Case(name=f"{t.get('collection') or record.get('target')}:{t.get('name')}",
                              classname=f"{lab}.{step_name(r)}", status=status, time=float(t.get("time_s") or 0.0),
                              message=f"{message} (log: {log})" if status == FAILED and log else message,
                              details="\n".join(lines), output=output))
    return cases
