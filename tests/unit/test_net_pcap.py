"""Captures: QEMU's pcap read in pieces, real timestamps from the guest's virtual clock, pcapng out."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from labctl.net.pcap import (
    Frame,
    PcapError,
    PcapReader,
    Retimer,
    Writer,
    pcap_header,
    pcapng_frame,
    pcapng_header,
    read_pcapng,
    summary_line,
)
from labctl.net.vmclock import (
    HPET_HZ,
    PM_TIMER_HZ,
    PM_TIMER_WRAP,
    VmClockError,
    parse_port,
    parse_xp,
    sample,
    vm_seconds,
)

ARP = bytes.fromhex("ffffffffffff525400570f38" "0806" "0001080006040001525400570f380a320001"
                    "0000000000000a320002")
ICMP = bytes.fromhex("525400aabbcc525400570f38" "0800" "45000054" "1234" "4000" "4001" "0000"
                     "0a320001" "0a320002") + bytes(64)


def qemu_pcap(frames: list[tuple[int, int, bytes]], endian: str = "<") -> bytes:
    """A pcap file as QEMU's dump code writes it: (seconds, microseconds, frame) records."""
    out = struct.pack(endian + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    for sec, usec, data in frames:
        out += struct.pack(endian + "IIII", sec, usec, len(data), len(data)) + data
    return out


def test_reader_gives_whole_frames_from_any_pieces() -> None:
    data = qemu_pcap([(100, 5, ARP), (101, 999_999, ICMP), (102, 0, ARP)])
    for cut in (1, 7, 23, 24, 25, 40, 41, 100):
        reader, got = PcapReader(), []
        for i in range(0, len(data), cut):
            got += reader.feed(data[i:i + cut])
        assert [(f.ts_us, f.data) for f in got] == [(100_000_005, ARP), (101_999_999, ICMP), (102_000_000, ARP)]
        assert reader.pending == 0


def test_reader_big_endian_and_garbage() -> None:
    (frame,) = PcapReader().feed(qemu_pcap([(7, 8, ARP)], ">"))
    assert frame.ts_us == 7_000_008
    with pytest.raises(PcapError):
        PcapReader().feed(b"\x00" * 30)


def test_retimer_shifts_by_the_measured_offset() -> None:
    assert Retimer(1_500_000)(Frame(10_000_000, ARP, 60)).ts_us == 8_500_000
    assert Retimer(None)(Frame(10_000_000, ARP, 60)).ts_us == 10_000_000


def test_pcapng_round_trip_keeps_name_times_and_lengths(tmp_path: Path) -> None:
    path = tmp_path / "a.pcapng"
    frames = [Frame(1_795_436_190_643_706, ARP, 60), Frame(1_795_436_190_700_000, ICMP[:50], len(ICMP))]
    path.write_bytes(pcapng_header("a.eth1", "e1000 on network lan") + b"".join(pcapng_frame(f) for f in frames))
    got = list(read_pcapng(path))
    assert [(f.interface, f.ts_us, f.caplen, f.length) for f in got] == \
        [("a.eth1", 1_795_436_190_643_706, 42, 60), ("a.eth1", 1_795_436_190_700_000, 50, len(ICMP))]


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed (setup.sh installs it)")
@pytest.mark.parametrize("fmt", ["pcapng", "pcap"])
def test_tshark_reads_what_labctl_writes(tmp_path: Path, fmt: str) -> None:
    w = Writer(fmt)
    path = tmp_path / f"x.{fmt}"
    path.write_bytes(w.header("a.eth1", "e1000") + w.frame(Frame(1_700_000_000_250_000, ICMP, len(ICMP))))
    fields = ["-e", "frame.time_epoch", "-e", "ip.src", "-e", "ip.dst"] + (
        ["-e", "frame.interface_name"] if fmt == "pcapng" else [])
    out = subprocess.run(["tshark", "-r", str(path), "-T", "fields", *fields], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[:3] == ["1700000000.250000000", "10.50.0.1", "10.50.0.2"]
    assert out[3:] == (["a.eth1"] if fmt == "pcapng" else [])


def test_pcap_header_is_classic() -> None:
    assert pcap_header()[:4] == struct.pack("<I", 0xA1B2C3D4)


def test_summary_lines() -> None:
    assert summary_line(Frame(0, ARP, 60)).endswith("52:54:00:57:0f:38 > ff:ff:ff:ff:ff:ff ARP 60")
    assert "10.50.0.1 > 10.50.0.2 ICMP" in summary_line(Frame(0, ICMP, len(ICMP)))
    frag = bytearray(ICMP)
    frag[20:22] = struct.pack("!H", 0x2000 | 185)
    assert summary_line(Frame(0, bytes(frag), len(frag))).endswith("fragment offset 1480 (more)")
    assert "runt" in summary_line(Frame(0, b"\x01\x02", 2))


# --------------------------------------------------------------------------- the virtual clock

def test_monitor_answers_as_recorded() -> None:
    """Recorded from a guest's monitor (QEMU 7.2): ``i /w 0x608`` and ``xp /1gx 0xfed000f0``."""
    assert parse_port("portl[0x0608] = 0x00bfde9c\r\n") == 0x00BFDE9C
    assert parse_xp("00000000fed000f0: 0x000000009b02a904\r\n") == 0x9B02A904
    with pytest.raises(VmClockError):
        parse_port("invalid char in format: 'l'\r\n")


def test_vm_clock_from_pm_timer_and_hpet() -> None:
    """Recorded together, 4 ms apart: 3.513 s into a PM timer period, HPET 26.006 s since the guest
    enabled it (0.945 s after the machine started): the machine ran 26.951 s."""
    v = vm_seconds(0x00BFDE9C, 0x9B02A904, pm_lead=0.004)
    assert v == pytest.approx(26.006 + 0.945, abs=0.002)
    for vm in (0.96, 4.0, 123.456, 86_400.5):  # any uptime, HPET enabled 0.95 s after start
        pm = round(vm * PM_TIMER_HZ) % PM_TIMER_WRAP
        assert vm_seconds(pm, round((vm - 0.95) * HPET_HZ)) == pytest.approx(vm, abs=1e-6)
    with pytest.raises(VmClockError):
        vm_seconds(0xFFFFFFFF, 1000)
    with pytest.raises(VmClockError):
        vm_seconds(1000, 0)


def test_sample_takes_the_quickest_reading() -> None:
    clock = iter([10.0, 10.01, 10.02,  # slow
                  20.0, 20.001, 20.002,  # quick
                  30.0, 30.05, 30.1])
    answers = {"i /w 0x608": f"portl[0x0608] = {round(5.0 * PM_TIMER_HZ) % PM_TIMER_WRAP:#010x}",
               "xp /1gx 0xfed000f0": f"00000000fed000f0: {round(4.0 * HPET_HZ):#018x}"}
    s = sample(answers.__getitem__, lambda: next(clock))
    assert s.wall == pytest.approx(20.0015) and s.origin == pytest.approx(20.0015 - s.vm)


def test_time_zone_guess_is_what_qemu_computes() -> None:
    from labctl.live.capture import _qemu_start_second

    now = time.time()
    assert _qemu_start_second(now) == int(time.mktime(time.gmtime(int(now))))
