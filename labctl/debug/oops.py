"""Find kernel oops reports in console text and parse their stack traces.

A *report* starts at a headline the kernel prints when something goes wrong:

=========================  ==========================================================
kind                       headline
=========================  ==========================================================
``bug``                    ``BUG: ...`` and ``kernel BUG at FILE:LINE!``
``oops``                   ``Oops: ...`` (when no BUG line came first)
``general_protection_fault``  ``general protection fault, ...``
``warning``                ``WARNING: CPU: 0 PID: 1 at FILE:LINE func+0x1/0x2``
``panic``                  ``Kernel panic - not syncing: ...``
``unregister_netdevice``   ``unregister_netdevice: waiting for DEV to become free``
=========================  ==========================================================

It ends at ``---[ end trace ... ]---``, ``Kernel Offset:``, the next headline, or
the end of the text. Inside it the parser collects the ``RIP:`` line of the
faulting context and every ``func+0xOFF/0xSIZE [module]`` frame, noting the
``<TASK>``/``<IRQ>``/``<NMI>`` section it is in and whether the kernel marked it
unreliable (``?``). A ``RIP:`` line *inside* the call trace is the saved IP of
an interrupted context (``regs`` frame); user-space ``RIP: 0033:0x7f...`` lines
are skipped.

Lines may carry prefixes: printk timestamps (``[   12.345678]``), caller ids
(``[    T1]``), printk levels (``<4>``), syslog/journal prefixes (``... kernel:``),
``dmesg -T`` dates, or arbitrary serial-log prefixes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# -- line prefixes -------------------------------------------------------------------

_TIMESTAMP = re.compile(r"\[\s*\d+\.\d+\](?:\[\s*[TC]\d+\])?")
_KNOWN_PREFIXES = (
    re.compile(r"^<\d+>"),  # printk level (console with printk.time=0, /dev/kmsg dumps)
    re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"),  # dmesg -T
    re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\S+) \S+ kernel: "),  # syslog, journal
    re.compile(r"^(?:kern|user|daemon|syslog|local\d)\s*:(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: "),  # dmesg -x
)


def split_prefix(line: str) -> tuple[str, bool]:
    """The kernel message in one console line, and whether its start is known.

    The message starts after the first printk timestamp (and caller id) if
    there is one, else after a recognised prefix. For any other line the
    whole line is returned with ``False``: its start is unknown, so patterns
    are searched in it rather than matched at its start.
    """
    line = line.rstrip("\r\n")
    m = _TIMESTAMP.search(line)
    if m:
        return line[m.end():], True
    for prefix in _KNOWN_PREFIXES:
        m = prefix.match(line)
        if m:
            rest = line[m.end():]
            ts = _TIMESTAMP.match(rest.lstrip())
            return (rest.lstrip()[ts.end():] if ts else rest), True
    return line, False


class _Pattern:
    """A regex tried at a message's start, or after a separator when the start is unknown."""

    def __init__(self, body: str) -> None:
        self.exact = re.compile(r"\s*" + body)
        self.loose = re.compile(r"(?:^|(?<=[\s|>\]:]))" + body)

    def find(self, message: str, exact: bool) -> re.Match[str] | None:
        return self.exact.match(message) if exact else self.loose.search(message)


# -- frames --------------------------------------------------------------------------

_SYMBOL = r"(?P<func>[A-Za-z_.$][\w.$]*)\+0x(?P<off>[0-9a-fA-F]+)/0x(?P<size>[0-9a-fA-F]+)" \
          r"(?:\s+\[(?P<mod>[\w-]+)(?:\s+[0-9a-f]+)?\])?"
_FRAME = _Pattern(r"(?:\[<[0-9a-f]+>\]\s*)?(?P<q>\?\s+)?" + _SYMBOL + r"\s*$")
_SYMBOL_ANYWHERE = re.compile(_SYMBOL)
_RIP = _Pattern(r"RIP: (?P<seg>[0-9a-f]{4}):(?P<rest>.*)$")
_CALL_TRACE = _Pattern(r"Call [Tt]race:\s*$")
_SECTION = _Pattern(r"<(?P<close>/?)(?P<name>TASK|IRQ|NMI|SOFTIRQ|EOI|#[A-Z]+)>\s*$")
_STACK_LABEL = _Pattern(r"(?P<label>(?:Allocated|Freed) by task \d+"
                        r"|(?:Second to last|Last) potentially related work creation):\s*$")
_TASK = re.compile(r"CPU: (?P<cpu>\d+) (?:UID: \d+ )?PID: (?P<pid>\d+) Comm: (?P<comm>\S+)")
_MODULES = _Pattern(r"Modules linked in:(?P<mods>.*)$")
_END = _Pattern(r"(?:---\[ end trace|---\[ end Kernel panic|Kernel Offset: )")


@dataclass(frozen=True)
class Frame:
    """One ``func+0xOFF/0xSIZE [module]`` entry of a report.

    ``kind`` is ``rip`` for the faulting instruction, ``regs`` for an IP
    printed from saved registers inside the trace (both exact addresses), and
    ``call`` for return addresses (which point just after a call).
    """

    func: str
    offset: int
    size: int
    module: str | None = None
    reliable: bool = True
    kind: str = "call"
    context: str = ""  # innermost <TASK>/<IRQ>/<NMI>/... section, lower case; "" outside any
    stack: str = ""  # "" for the main trace, else e.g. "Freed by task 12" (KASAN)
    line_no: int = 0  # 1-based line in the input

    @property
    def symbol(self) -> str:
        """``func+0xoff/0xsize`` as the kernel prints it."""
        return f"{self.func}+{self.offset:#x}/{self.size:#x}"

    @property
    def is_return_address(self) -> bool:
        """Whether the IP is a return address, to be looked up at pc-1.

        Offset 0 can only be an exact address (a call never ends a function
        at its first byte), so it is not adjusted either.
        """
        return self.kind == "call" and self.offset > 0


@dataclass
class Oops:
    """One report found in console text (see the module docstring)."""

    kind: str
    headline: str  # the headline's message, e.g. "BUG: kernel NULL pointer dereference, address: ..."
    text: str  # the headline after its kind prefix
    line_no: int
    rip: Frame | None = None
    frames: list[Frame] = field(default_factory=list)
    panic: str | None = None  # "Kernel panic - not syncing: ..." that followed without a trace of its own
    cpu: int | None = None
    pid: int | None = None
    comm: str | None = None
    modules: list[str] = field(default_factory=list)
    title: str = ""


# -- headlines -----------------------------------------------------------------------

_HEADLINES: tuple[tuple[str, _Pattern], ...] = (
    ("warning", _Pattern(r"WARNING: (?P<text>.*)$")),
    ("bug", _Pattern(r"kernel BUG at (?P<text>.*)$")),
    ("bug", _Pattern(r"BUG: (?P<text>.*)$")),
    ("general_protection_fault", _Pattern(r"general protection fault(?P<text>.*)$")),
    ("panic", _Pattern(r"Kernel panic - not syncing: ?(?P<text>.*)$")),
    ("oops", _Pattern(r"Oops: (?P<text>.*)$")),
    ("unregister_netdevice", _Pattern(r"unregister_netdevice: waiting for (?P<text>.*)$")),
)


def _match_headline(message: str, exact: bool) -> tuple[str, str, str] | None:
    """``(kind, headline, text)`` when ``message`` starts a report."""
    for kind, pattern in _HEADLINES:
        m = pattern.find(message, exact)
        if m:
            return kind, message[m.start():].strip(), m.group("text").strip()
    return None


def _frame_from_match(m: re.Match[str], **kw: object) -> Frame:
    return Frame(func=m.group("func"), offset=int(m.group("off"), 16), size=int(m.group("size"), 16),
                 module=m.group("mod"), **kw)  # type: ignore[arg-type]


# -- the parser ----------------------------------------------------------------------

class _Parser:
    """Line-by-line state machine building :class:`Oops` reports."""

    def __init__(self) -> None:
        self.reports: list[Oops] = []
        self.current: Oops | None = None
        self.in_trace = False
        self.contexts: list[str] = []
        self.stack = ""

    def feed(self, line_no: int, line: str) -> None:
        message, exact = split_prefix(line)
        if not message.strip():
            return
        head = _match_headline(message, exact)
        if head and not self._continues_current(head[0]):
            self._open(head, line_no)
            return
        if self.current is None or head:
            return
        if _END.find(message, exact):
            self._close()
            return
        self._body_line(line_no, message, exact)

    def _continues_current(self, kind: str) -> bool:
        """``Oops: 0000 [#1]`` right after ``BUG: ...`` belongs to that BUG's report."""
        cur = self.current
        return kind == "oops" and cur is not None and cur.kind == "bug" and not cur.frames and cur.rip is None

    def _open(self, head: tuple[str, str, str], line_no: int) -> None:
        self._close()
        kind, headline, text = head
        self.current = Oops(kind=kind, headline=headline, text=text, line_no=line_no)
        self.in_trace = False
        self.contexts = []
        self.stack = ""

    def _close(self) -> None:
        if self.current is not None:
            self.reports.append(self.current)
            self.current = None

    def _body_line(self, line_no: int, message: str, exact: bool) -> None:
        assert self.current is not None
        for handler in (self._rip, self._markers, self._frame, self._details):
            if handler(line_no, message, exact):
                return

    def _rip(self, line_no: int, message: str, exact: bool) -> bool:
        m = _RIP.find(message, exact)
        if not m:
            return False
        sym = _SYMBOL_ANYWHERE.search(m.group("rest"))
        cur = self.current
        assert cur is not None
        if sym is None or m.group("seg") == "0033":
            return True  # a user-space IP: nothing to decode
        if cur.rip is None and not self.in_trace:
            cur.rip = _frame_from_match(sym, kind="rip", context=self._context(), line_no=line_no)
        elif self.in_trace:
            cur.frames.append(_frame_from_match(sym, kind="regs", context=self._context(),
                                                stack=self.stack, line_no=line_no))
        return True

    def _markers(self, line_no: int, message: str, exact: bool) -> bool:
        if _CALL_TRACE.find(message, exact):
            self.in_trace, self.contexts, self.stack = True, [], ""
            return True
        m = _SECTION.find(message, exact)
        if m:
            name = m.group("name").lower()
            if m.group("close"):
                if name in self.contexts:
                    del self.contexts[len(self.contexts) - 1 - self.contexts[::-1].index(name):]
            else:
                self.contexts.append(name)
            return True
        m = _STACK_LABEL.find(message, exact)
        if m:
            self.stack, self.contexts = m.group("label"), []
            return True
        return False

    def _frame(self, line_no: int, message: str, exact: bool) -> bool:
        m = _FRAME.find(message, exact)
        if not m:
            return False
        assert self.current is not None
        self.current.frames.append(_frame_from_match(
            m, reliable=m.group("q") is None, kind="call", context=self._context(), stack=self.stack,
            line_no=line_no))
        return True

    def _details(self, line_no: int, message: str, exact: bool) -> bool:
        cur = self.current
        assert cur is not None
        m = _TASK.search(message)
        if m and cur.pid is None:
            cur.cpu, cur.pid, cur.comm = int(m.group("cpu")), int(m.group("pid")), m.group("comm")
            return True
        m = _MODULES.find(message, exact)
        if m and not cur.modules:
            cur.modules = m.group("mods").split()
            return True
        return False

    def _context(self) -> str:
        return self.contexts[-1] if self.contexts else ""

    def finish(self) -> list[Oops]:
        self._close()
        reports = _fold_panics([r for r in self.reports if r.frames or r.rip or r.kind != "warning"])
        for r in reports:
            r.title = make_title(r)
        return reports


def _fold_panics(reports: list[Oops]) -> list[Oops]:
    """Attach a trace-less ``Kernel panic`` to the report before it ("Fatal exception")."""
    out: list[Oops] = []
    for r in reports:
        if r.kind == "panic" and not r.frames and r.rip is None and out and out[-1].panic is None:
            out[-1].panic = r.headline
        else:
            out.append(r)
    return out


def parse_oopses(text: str | Iterable[str]) -> list[Oops]:
    """Every report in ``text`` (a string or an iterable of lines), in order."""
    lines = text.splitlines() if isinstance(text, str) else text
    parser = _Parser()
    for n, line in enumerate(lines, 1):
        parser.feed(n, line)
    return parser.finish()


# -- titles --------------------------------------------------------------------------

# Functions that report a problem rather than cause it: skipped when picking the culprit.
_REPORTERS = frozenset({
    "dump_stack", "dump_stack_lvl", "show_stack", "show_trace_log_lvl", "panic", "vpanic", "__warn",
    "warn_slowpath_fmt", "__warn_printk", "report_bug", "handle_bug", "exc_invalid_op", "asm_exc_invalid_op",
    "die", "__die", "oops_end", "_printk", "printk", "vprintk", "vprintk_emit", "nmi_cpu_backtrace",
    "kasan_report", "print_report", "check_panic_on_warn", "__might_resched", "__might_sleep",
    "__schedule_bug", "netdev_wait_allrefs_any", "netdev_run_todo",
})
_SUFFIX = re.compile(r"(?:\.(?:cold|isra|constprop|part|llvm|lto_priv)(?:\.\d+)?)+$")
_WARN_AT = re.compile(r"(?:CPU: \d+ (?:UID: \d+ )?PID: \d+ )?at (?:\S+:\d+ )?(?P<func>[A-Za-z_.$][\w.$]*)\+0x")
_BUG_IN = re.compile(r"^(?P<what>.*?) in (?P<func>[A-Za-z_.$][\w.$]*)\+0x[0-9a-f]+/0x[0-9a-f]+")
_BUG_CUTS = re.compile(r",\s| - | at | for address| on CPU| in process|: ")
_DIE_CODE = re.compile(r"(?:^|:\s*)[0-9a-f]{4} \[#\d+\].*$")


def clean_func(name: str) -> str:
    """``foo.isra.0`` / ``foo.cold`` -> ``foo``: compiler clones share their origin's title."""
    return _SUFFIX.sub("", name)


def culprit(oops: Oops) -> str | None:
    """The function a report is about: the RIP's, else the first reliable non-reporting frame."""
    if oops.rip is not None:
        return clean_func(oops.rip.func)
    for f in oops.frames:
        if f.reliable and not f.stack and clean_func(f.func) not in _REPORTERS:
            return clean_func(f.func)
    return None


def _short(text: str) -> str:
    """``kernel NULL pointer dereference, address: 00c8`` -> ``kernel NULL pointer dereference``."""
    m = _BUG_CUTS.search(text)
    return (text[:m.start()] if m else text).rstrip(" .!:")


def make_title(oops: Oops) -> str:
    """A short, stable title that recognises repeats of the same problem.

    Examples: ``BUG: kernel NULL pointer dereference in cp_start_xmit``,
    ``general protection fault in start_xmit``, ``WARNING in page_to_skb``,
    ``Kernel panic - not syncing: sysrq triggered crash``.
    """
    func = culprit(oops)
    where = f" in {func}" if func else ""
    text = oops.text
    if oops.kind == "warning":
        m = _WARN_AT.match(text)
        return f"WARNING in {clean_func(m.group('func'))}" if m else f"WARNING: {text}"
    if oops.kind == "bug":
        if oops.headline.startswith("kernel BUG at"):
            return f"kernel BUG{where}"
        m = _BUG_IN.match(text)
        if m:
            return f"BUG: {m.group('what')} in {clean_func(m.group('func'))}"
        return f"BUG: {_short(text)}{where}"
    if oops.kind == "oops":
        what = _DIE_CODE.sub("", text).strip()
        return f"Oops: {what}{where}" if what else f"Oops{where}"
    if oops.kind == "general_protection_fault":
        return f"general protection fault{where}"
    if oops.kind == "unregister_netdevice":
        return "unregister_netdevice: waiting for " + text.split(". ")[0].rstrip(".")
    return f"Kernel panic - not syncing: {text}"
