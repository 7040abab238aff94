"""Issue 47 (round four), Low 11 and 12: follow's filter reaches tcpdump as data, never an option
(the real tcpdump asked), and its trace_pipe reader holds no line over its cap."""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path

import pytest

from labctl.follow.follower import libpcap_error
from labctl.follow.livefollow import LineSplitter


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="needs tcpdump")
def test_a_filter_is_never_an_option_to_tcpdump(tmp_path: Path) -> None:
    """``-F FILE`` would have tcpdump read FILE as the expression: its error tells whether a root file
    exists and what it holds ("syntax error" or "No such file")."""
    present = tmp_path / "present"
    present.write_text("secret words here\n")
    for text in (f"-F{present}", f"-F{tmp_path / 'absent'}", f"  -F{present}", "-d"):
        assert str(libpcap_error(text)).endswith("a filter cannot start with '-'")
    assert libpcap_error("tcp port 80") is None
    assert libpcap_error("tcp port") is not None  # a real syntax error still reaches the user


def test_a_line_without_end_holds_no_more_than_the_cap() -> None:
    s = LineSplitter(max_line=1000)
    assert s.feed(b"a\nbb\ncc") == [b"a", b"bb"] and s.feed(b"c\n") == [b"ccc"]
    tracemalloc.start()
    try:
        for _ in range(2000):  # 64 MB without a newline
            assert s.feed(b"x" * 32768) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert s.feed(b"tail\nnext\n") == [b"next"] and s.dropped == 1  # the long line dropped whole
    assert s.feed(b"y" * 999 + b"\n") == [b"y" * 999]
    assert s.feed(b"z" * 600) == [] and s.feed(b"z" * 600 + b"\nok\n") == [b"ok"] and s.dropped == 2
