"""Guest, console and file text never reaches the terminal as control sequences (issue 19, item 8)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.live import Live
from rich.table import Table
from rich.text import Text
from test_oops_cli import labctl, with_fake_addr2line  # noqa: F401  (fixture)
from test_oops_symbolize import LOG, FakeKernel, fake  # noqa: F401  (fixture)

from labctl.cli import ui
from labctl.textsafe import is_safe, safe_line, safe_text

TITLE = "\x1b]0;pwned\x07"  # sets the terminal's title
CLEAR = "\x1b[2J"  # clears the screen
CSI = "\x9b"  # the C1 form of ESC [


def assert_no_controls(s: str) -> None:
    bad = sorted({f"{ord(c):#x}" for c in s if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F})
    assert not bad, f"raw control characters {bad} in {s!r}"


# -- the helper ------------------------------------------------------------------------

def test_escapes_c0_esc_del_and_c1_visibly() -> None:
    assert safe_text(f"a{TITLE}b{CLEAR}c") == "a\\x1b]0;pwned\\x07b\\x1b[2Jc"
    assert safe_text("\x00\x08\x0b\x0c\x0d\x7f\x80\x9b\x9f") == "\\x00\\x08\\x0b\\x0c\\x0d\\x7f\\x80\\x9b\\x9f"


def test_keeps_tabs_newlines_and_ordinary_unicode() -> None:
    text = "name\tvalue\nsecond line · é ✓ 日本 \u00a0 \ufffd\n"
    assert safe_text(text) == text
    assert is_safe(text)


def test_crlf_is_one_newline_but_a_lone_cr_is_shown() -> None:
    assert safe_text("a\r\nb\rc") == "a\nb\\x0dc"


def test_one_line_text_escapes_newlines_too() -> None:
    assert safe_line("a\nb\tc\r\n") == "a\\x0ab\tc\\x0d\\x0a"
    assert not is_safe("a\nb", multiline=False) and is_safe("a\nb")


def test_bidi_overrides_and_isolates_are_shown() -> None:
    assert safe_text("x\u202ey\u2066z\u2069") == "x\\u202ey\\u2066z\\u2069"
    assert safe_text("\u200f") == "\u200f"  # a mark, not an override: kept


def test_idempotent() -> None:
    once = safe_text(f"{TITLE}{CLEAR}{CSI}\u202e\r")
    assert safe_text(once) == once and is_safe(once)


# -- the consoles ----------------------------------------------------------------------

def render(*renderables: object, terminal: bool = True) -> str:
    buf = io.StringIO()
    c = ui.SafeConsole(file=buf, markup=False, highlight=False, width=100, force_terminal=terminal)
    for r in renderables:
        c.print(r)
    return buf.getvalue()


def test_console_escapes_text_strings_and_table_cells_but_keeps_styles() -> None:
    t = Table()
    t.add_column("driver")
    t.add_row(f"virtio_net{CLEAR}")
    t.add_row(Text(f"e1000{TITLE}"))
    t.add_row("cr\rbs\x08")
    got = render(Text(f"title {TITLE}", style="bold"), f"plain {CSI}2J", t)
    assert "cr\\x0dbs\\x08" in got  # a plain string's controls are shown, not dropped as rich's Text() would
    assert "\x1b[1m" in got  # bold is still a style
    assert CLEAR not in got and "]0;pwned" not in got.replace("\\x1b]0;pwned", "") and CSI not in got
    assert "\\x1b[2J" in got and "\\x1b]0;pwned" in got and "\\x9b2J" in got
    plain = render(Text(f"title {TITLE}", style="bold"), f"plain {CSI}2J", t, terminal=False)
    assert_no_controls(plain)


def test_live_display_keeps_its_own_cursor_codes() -> None:
    buf = io.StringIO()
    c = ui.SafeConsole(file=buf, markup=False, highlight=False, width=100, force_terminal=True)
    with Live(Text(f"step {CLEAR}"), console=c, transient=True):
        pass
    got = buf.getvalue()
    assert "\x1b[?25l" in got and "\x1b[?25h" in got  # cursor hidden and shown again: rich's control segments
    assert CLEAR not in got and "step \\x1b[2J" in got


def test_error_and_warning_show_guest_text_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    ui.error(f"setup of a failed: {TITLE}{CLEAR}done", hint=f"see {CSI}")
    ui.warn(f"guest b said \x07\x08{CLEAR}")
    err = capsys.readouterr().err
    assert_no_controls(err)
    assert "\\x1b]0;pwned\\x07\\x1b[2Jdone" in err and "see \\x9b" in err and "said \\x07\\x08\\x1b[2J" in err


def test_json_output_escapes_controls() -> None:
    assert_no_controls(json.dumps({"t": TITLE + CLEAR + CSI}))


# -- end to end: labctl oops decode ------------------------------------------------------

HOSTILE_LOG = (LOG
               .replace("address: 0000000000000010", f"address: 0000000000000010 {TITLE}{CLEAR}")
               .replace("[  1.1] Oops: 0000", f"[  1.05] CPU: 0 PID: 7 Comm: ev{CLEAR}il\n[  1.1] Oops: 0000")
               .replace("[  2.7] ---[ end trace", f"[  2.65] Kernel panic - not syncing: {CSI}2J{TITLE}\n"
                                                 "[  2.7] ---[ end trace"))


def test_oops_decode_prints_console_text_escaped(labctl, fake: FakeKernel, tmp_path: Path,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "console.log"
    log.write_text(HOSTILE_LOG)
    rc, out, err = labctl("oops", "decode", str(log), *with_fake_addr2line(fake, monkeypatch))
    assert rc == 0, err
    assert_no_controls(out)
    assert_no_controls(err)
    lines = out.splitlines()
    assert lines[0] == "#1 BUG: kernel NULL pointer dereference in fn_xmit"
    assert "  line 1: BUG: kernel NULL pointer dereference, address: 0000000000000010 \\x1b]0;pwned\\x07\\x1b[2J" \
        in lines
    assert "  CPU 0, PID 7 (ev\\x1b[2Jil)" in lines
    assert any(line.startswith("  then: Kernel panic") and line.endswith("\\x9b2J\\x1b]0;pwned\\x07")
               for line in lines), lines
    assert "#2 WARNING in gamma" in lines


def test_oops_decode_json_keeps_the_console_text_exact(labctl, fake: FakeKernel, tmp_path: Path,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "console.log"
    log.write_text(HOSTILE_LOG)
    rc, out, _ = labctl("oops", "decode", str(log), "--json", *with_fake_addr2line(fake, monkeypatch))
    assert rc == 0
    assert_no_controls(out)  # JSON escapes them (\u001b) ...
    assert json.loads(out)[0]["headline"].endswith(f"{TITLE}{CLEAR}")  # ... and a reader gets them back exactly


# -- labctl status and check: guest text in tables ------------------------------------------

def test_status_table_shows_guest_drivers_escaped(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A guest's READY line names its NICs' drivers: whatever it wrote there is shown, escaped, in its column."""
    from types import SimpleNamespace

    from labctl.cli import status_cmd as lifecycle_cmds
    from labctl.up.status import GuestStatus

    nic = {"name": "eth1", "model": "virtio", "driver": f"virtio_net{TITLE}{CLEAR}", "ip": "10.0.0.1/24",
           "network": "lan", "link": "up", "impair": {}}
    statuses = [GuestStatus("a", "running", "127.0.0.1:2222", None, "tcg", 1, [nic])]
    monkeypatch.setattr(lifecycle_cmds, "guest_statuses", lambda state: statuses)
    monkeypatch.setattr(lifecycle_cmds, "_kernel_of", lambda state, guest: {"release": "6.1.0-x"})
    monkeypatch.setattr(lifecycle_cmds, "active_captures", lambda state: [])
    state = SimpleNamespace(lab="evil", resolved={}, incomplete=False, phase=lifecycle_cmds.UP, guests={"a": None},
                            hosts={}, guest_spec=lambda name: None)
    lifecycle_cmds.print_lab(state)  # type: ignore[arg-type]
    got = capsys.readouterr().out
    assert_no_controls(got)
    assert "virtio_net\\x1b]0;pwned\\x07\\x1b[2J" in got
    rows = [line for line in got.splitlines() if "│" in line]
    assert len({len(r) for r in rows}) == 1, got  # columns measured on the escaped text: the table stays aligned


def test_check_table_shows_guest_output_escaped() -> None:
    from labctl.cli.check_cmd import results_table
    from labctl.grading import ERROR, CheckResult

    t = results_table("lab evil", [CheckResult("ping", "a", ERROR, hint="run ping", detail=f"ssh said {CLEAR}{CSI}")])
    got = render(t, terminal=False)
    assert_no_controls(got)
    assert "error: ssh said \\x1b[2J\\x9b" in got


# -- errors: lab file problems and log records ---------------------------------------------

def test_lab_file_problems_name_a_hostile_file_escaped(labctl, tmp_path: Path) -> None:  # noqa: F811
    rc, out, err = labctl("validate", str(tmp_path / f"lab{CLEAR}{TITLE}.yaml"))
    assert rc == 2
    assert_no_controls(out + err)
    assert "lab\\x1b[2J\\x1b]0;pwned\\x07.yaml:1: cannot read lab file" in err


def test_log_records_are_escaped() -> None:
    import logging

    from labctl.cli.ui import SafeFormatter

    record = logging.LogRecord("labctl.x", logging.WARNING, __file__, 1, "guest said %s", (TITLE + CLEAR,), None)
    got = SafeFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert got == "WARNING labctl.x: guest said \\x1b]0;pwned\\x07\\x1b[2J"


def test_graph_of_a_running_lab_shows_guest_drivers_escaped() -> None:
    from labctl.net.graph import runtime_from_state, to_dot, to_mermaid, to_svg, topology

    lab = {"name": "evil", "networks": {"lan": {}},
           "guests": {"a": {"nics": [{"name": "eth1", "model": "virtio", "network": "lan"}]}}}
    topo = topology(lab, runtime_from_state({"a": {"eth1": f"virtio_net{TITLE}{CLEAR}{CSI}"}}))
    for render_format in (to_svg, to_dot, to_mermaid):
        got = render_format(topo)
        assert_no_controls(got)
        assert "virtio_net\\x1b]0;pwned\\x07\\x1b[2J\\x9b" in got, render_format


def test_a_steps_progress_is_printed_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from labctl.cli.displays import StepLines

    StepLines().step_progress("make: 10 programs compiled [bold]x[/bold] \x1b[2J")
    err = capsys.readouterr().err
    assert "make: 10 programs compiled [bold]x[/bold]" in err and "\x1b[2J" not in err
