"""``labctl oops decode`` end to end with a fake vmlinux and addr2line: output, JSON, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_oops_symbolize import LOG, FakeKernel, fake  # noqa: F401  (fixture)

from labctl.cli import main
from labctl.debug.oops import Frame
from labctl.debug.oops_text import render_frame
from labctl.debug.symbolize import DecodedFrame, SourceLocation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oops"


@pytest.fixture
def labctl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run labctl's real main() in-process, with its own parser (a dropped command fails here)."""
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path / "labctl-cache"))

    def run(*argv: str) -> tuple[int, str, str]:
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def with_fake_addr2line(fake: FakeKernel, monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: F811
    monkeypatch.setenv("PATH", f"{fake.addr2line.parent}:{Path('/usr/bin')}:{Path('/bin')}")
    return ["--vmlinux", str(fake.vmlinux), "--modules", str(fake.modules)]


def test_text_output(labctl, fake: FakeKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    log = tmp_path / "console.log"
    log.write_text(LOG)
    rc, out, err = labctl("oops", "decode", str(log), *with_fake_addr2line(fake, monkeypatch))
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "#1 BUG: kernel NULL pointer dereference in fn_xmit"
    assert "  RIP: fn_xmit+0x4e/0x891 [fake_nic]  drivers/net/text/f.c:3022 (fn_2bce)" in lines
    assert "  <IRQ>" in lines and "  <TASK>" in lines
    assert "    alpha+0x11/0x40  kernel/f.c:272 (fn_ffffffff81000110)" in lines
    assert "    ? beta+0x5/0x20  kernel/f.c:324 (fn_ffffffff81000144)" in lines
    i = lines.index("    fn_poll.cold+0xa/0x1e0 [fake_nic]  include/linux/inner.h:41 (inner_fn)")
    assert lines[i + 1] == "        (inlined by) outer_fn drivers/net/text.unlikely/outer.c:2"
    assert any(l.startswith("    other+0x1/0x10 [not_here]  [module not_here: no .ko") for l in lines)
    assert "#2 WARNING in gamma" in lines
    assert "Traceback" not in err


def test_json_output(labctl, fake: FakeKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    log = tmp_path / "console.log"
    log.write_text(LOG)
    rc, out, _ = labctl("oops", "decode", str(log), "--json", *with_fake_addr2line(fake, monkeypatch))
    assert rc == 0
    data = json.loads(out)
    assert [o["title"] for o in data] == ["BUG: kernel NULL pointer dereference in fn_xmit", "WARNING in gamma"]
    rip = data[0]["rip"]
    assert (rip["func"], rip["offset"], rip["size"], rip["module"], rip["reliable"]) == ("fn_xmit", 0x4E, 0x891,
                                                                                        "fake_nic", True)
    assert (rip["address"], rip["section"], rip["file"], rip["line"]) == ("0x2bce", ".text", "drivers/net/text/f.c",
                                                                          0xBCE)
    beta = data[0]["frames"][1]
    assert beta["reliable"] is False and beta["context"] == "irq" and beta["address"] == "0xffffffff81000145"
    cold = data[0]["frames"][2]
    assert cold["inlined"] == [{"func": "outer_fn", "file": "drivers/net/text.unlikely/outer.c", "line": 2}]


def test_stdin_and_no_oops(labctl, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import sys

    class Stdin:
        buffer = io.BytesIO(b"[ 1.0] nothing to see\n")

    monkeypatch.setattr(sys, "stdin", Stdin())
    rc, out, _ = labctl("oops", "decode", "-", "--vmlinux", "/nonexistent")
    assert (rc, out.strip()) == (0, "no oops found in -")
    rc, out, _ = labctl("oops", "decode", str(FIXTURES / "sysrq-crash.console.log").replace("sysrq-crash", "none"))
    assert rc == 2


def test_json_without_oops_is_an_empty_list(labctl, tmp_path: Path) -> None:
    log = tmp_path / "clean.log"
    log.write_text("LABCTL-READY g 6.1\n")
    rc, out, _ = labctl("oops", "decode", str(log), "--json")
    assert (rc, json.loads(out)) == (0, [])


def test_missing_vmlinux_is_an_image_error(labctl) -> None:
    rc, _, err = labctl("oops", "decode", str(FIXTURES / "sysrq-crash.console.log"), "--vmlinux", "/nonexistent")
    assert rc == 3
    assert "vmlinux not found: /nonexistent" in err and "Traceback" not in err


def test_missing_file_is_a_usage_error(labctl, tmp_path: Path) -> None:
    rc, _, err = labctl("oops", "decode", str(tmp_path / "missing.log"))
    assert rc == 2 and "cannot read" in err


def test_render_frame_keeps_brackets_literal() -> None:
    d = DecodedFrame(Frame("start_xmit", 0x19, 0x5A0, "virtio_net", kind="rip"), address=0x3639, section=".text",
                     locations=(SourceLocation("skb_get_queue_mapping", "include/linux/skbuff.h", 4907),
                                SourceLocation("start_xmit", "drivers/net/virtio_net.c", 1896)))
    lines = [t.plain for t in render_frame(d, "  ", label="RIP: ")]
    assert lines == ["  RIP: start_xmit+0x19/0x5a0 [virtio_net]  include/linux/skbuff.h:4907 (skb_get_queue_mapping)",
                     "      (inlined by) start_xmit drivers/net/virtio_net.c:1896"]
    cold = DecodedFrame(Frame("__handle_sysrq.cold", 0x41, 0x11C, reliable=False), address=1,
                        locations=(SourceLocation("__handle_sysrq", "drivers/tty/sysrq.c", 603),))
    assert [t.plain for t in render_frame(cold, "")] == [
        "? __handle_sysrq.cold+0x41/0x11c  drivers/tty/sysrq.c:603"]
