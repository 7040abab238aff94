"""``labctl capture``'s copy loop (labctl.live.capture.follow) on a file as QEMU's filter-dump writes it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from labctl.live.capture import Capture, Written, follow
from labctl.net.pcap import PcapReader
from tests.unit.test_net_pcap import qemu_pcap

FRAMES = [(1, i, bytes([i]) * 60) for i in range(4)]


def _cap(tmp_path: Path) -> Capture:
    path = tmp_path / "dump.pcap"
    path.write_bytes(qemu_pcap(FRAMES))
    return Capture(id="c", guest="b", nic="eth1", netdev="n", file=str(path), owner=1, purpose="live")


def _frames_in(pcap: bytes) -> list[bytes]:
    return [f.data for f in PcapReader().feed(pcap)]


def test_ctrl_c_between_two_polls_still_copies_what_qemu_wrote(tmp_path: Path) -> None:
    """Ctrl-C arrives before the loop read the file: the four frames QEMU wrote are in the output
    all the same, and the interrupt goes on up (the command says "interrupted")."""
    calls = []

    def stop_when(written: Written) -> bool:
        calls.append(written.frames)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return False

    out, written = io.BytesIO(), Written()
    with pytest.raises(KeyboardInterrupt):
        follow(_cap(tmp_path), out, stop_when, label="b.eth1", description="d", fmt="pcap", written=written)
    assert written.frames == 4
    assert _frames_in(out.getvalue()) == [d for *_, d in FRAMES]


def test_ctrl_c_still_honours_the_frame_count(tmp_path: Path) -> None:
    """``--count 2`` and Ctrl-C: two frames, not four."""
    state = {"raised": False}

    def stop_when(written: Written) -> bool:
        if not state["raised"]:
            state["raised"] = True
            raise KeyboardInterrupt
        return written.frames >= 2

    out, written = io.BytesIO(), Written()
    with pytest.raises(KeyboardInterrupt):
        follow(_cap(tmp_path), out, stop_when, label="b.eth1", description="d", fmt="pcap", written=written)
    assert written.frames == 2 and len(_frames_in(out.getvalue())) == 2
