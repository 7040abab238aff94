"""GRE and GRETAP tunnels with checksums and sequence numbers (``csum: true``, ``seq: true``): the lab
file's options (labctl.lab.tunnels.gre), the header layout they make (its Framing: the checksum word
before the key, the sequence number after it), the probes that follow the inner packet through it
(labctl.follow.tunnelprobes), what their events say (labctl.trace.encap) and the wire captures.
The same on real guests: tests/integration/test_tunnels.py (labs/vxlan-router.yaml's tap0)."""

from __future__ import annotations

import pytest

from labctl.errors import LabFileError
from labctl.follow import tunnelprobes
from labctl.lab import KINDS, Tunnel, load_lab_text, tunnel_lines
from labctl.lab.tunnels.framing import Framing
from labctl.pktfilter import parse as parse_filter
from labctl.trace import encap
from labctl.trace.hops import identity, parse_line
from tests.unit.test_follow_tunnels import OFF, OUTER, _frame, _line

LAB = """\
name: grex
networks: {left: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: 10.1.0.2/24}]
    tunnels:
      tap0: {type: gretap, remote: 10.1.0.3, key: 5, csum: true, seq: true}
      gre1: {type: gre, remote: 10.1.0.3, seq: true}
      gre2: {type: gre, remote: 10.1.0.3, csum: false}
  b:
    nics: [{name: eth1, model: virtio, network: left, ip: 10.1.0.3/24}]
"""


def _lab() -> dict[str, object]:
    return load_lab_text(LAB, "lab.yaml").to_dict()


def _framing(kind: str, **options: str) -> Framing:
    f = KINDS[kind].framing(Tunnel("t", kind, options=tuple(options.items())))
    assert f is not None
    return f


def test_the_flags_are_options_that_reach_ip_link_and_the_description() -> None:
    lab = load_lab_text(LAB, "lab.yaml")
    tunnels = {t.name: t for t in lab.guests["a"].tunnels}
    assert KINDS["gretap"].link(tunnels["tap0"]) == ["ip", "link", "add", "tap0", "type", "gretap", "remote", "10.1.0.3",
                                                     "key", "5", "csum", "seq"]
    assert KINDS["gre"].link(tunnels["gre1"])[-2:] == ["10.1.0.3", "seq"]
    assert KINDS["gre"].link(tunnels["gre2"])[-1] == "10.1.0.3"  # false: as if not given
    assert "tunnel tap0: gretap to 10.1.0.3 key 5 csum seq" in tunnel_lines(lab.to_dict()["guests"]["a"])


def test_a_flag_that_is_not_true_or_false_is_refused_at_its_line() -> None:
    text = LAB.replace("seq: true}", "seq: yes-please}", 1)
    with pytest.raises(LabFileError) as err:
        load_lab_text(text, "lab.yaml")
    assert [str(p) for p in err.value.problems] == [
        "lab.yaml:7: guests.a.tunnels.tap0.seq: expected true or false, got 'yes-please'"], err.value.problems


def test_each_layout_has_its_words_in_rfc_2890s_order() -> None:
    plain = _framing("gretap")
    assert (plain.tag, plain.inner, plain.word, plain.seq_at, plain.csum) == ("gtap", 4 + 14, 0x00006558, 0, False)
    every = _framing("gretap", key="5", csum="yes", seq="yes")
    # flags C, K and S (b0 00), Ethernet (65 58); checksum and reserved, key, sequence number; then Ethernet
    assert (every.tag, every.word, every.ident_at, every.seq_at, every.inner) == ("gtapcks", 0xB0006558, 8, 12, 16 + 14)
    seq = _framing("gre", seq="yes")
    assert (seq.tag, seq.word, seq.ident, seq.seq_at, seq.inner) == ("gres", 0x10000800, "", 4, 8)
    csum = _framing("gre", csum="yes", key="7")
    assert (csum.tag, csum.word, csum.ident_at, csum.inner, csum.csum) == ("greck", 0xA0000800, 8, 12, True)
    assert len({f.tag for k in ("gre", "gretap") for f in KINDS[k].framings}) == 16  # every layout its own probes


def test_the_probes_read_the_key_and_the_sequence_number_where_the_checksum_puts_them() -> None:
    defs, filters = tunnelprobes.definitions("labctl_t", parse_filter("icmp"), OFF, _lab(), "a")
    by = {d.split()[0].split("/")[1]: d for d in defs}
    xmit = by["xmit_gtapcks"]
    assert "saddr=+76(+208($skbaddr)):u32" in xmit  # 14 + 20 + 16 (GRE: flags, csum, key, seq) + 14 + 12
    assert "oid=+42(+208($skbaddr)):u32" in xmit and "oseq=+46(+208($skbaddr)):u32" in xmit  # after the checksum
    assert filters["xmit_gtapcks"].endswith("&& opr == 47 && ohd == 1483014320")  # b0 00 65 58 read little-endian
    assert "oseq=+4(+208(%di)):u32" in by["encap_gres"] and "oid" not in by["encap_gres"]  # gre1: seq right after
    assert "saddr=+20(+208(%di)):u32" in by["decap_gres"]  # 8 + 12
    assert "xmit_gre" in by and not any(n.endswith("_grec") for n in by)  # gre2: csum false is plain GRE


def test_an_event_says_the_sequence_number_and_the_checksum() -> None:
    seq3 = int.from_bytes((3).to_bytes(4, "big"), "little")
    ev = parse_line(_line("ip_fwd_gtapcks", "ip_forward",
                          f"{OUTER} opr=47 ohd=1483014320 oid=83886080 oseq={seq3}"), "r")
    assert ev is not None and ev.point == "ip_fwd" and identity(ev) is not None
    assert encap.note(ev.point, ev.fields) == "outer GRE 10.1.0.2 > 10.2.0.2 key 5 seq 3 csum"
    ev = parse_line(_line("decap_gres", "ip_gre:gre_rcv", f"ohd=524304 oseq={seq3}"), "b")
    assert ev is not None and encap.note(ev.point, ev.fields) == "GRE seq 3"
    assert encap.where(ev.point, ev.fields) == "gre_rcv"


def test_the_wire_captures_find_the_inner_header_after_every_word() -> None:
    lab = tunnelprobes.framings(_lab())
    every = _frame(47, bytes.fromhex("b0006558 abcd0000 00000005 00000003"), inner_eth=True)
    h = tunnelprobes.inner_header(every, lab)
    assert h is not None and (h.saddr, h.daddr) == (0xC0A80501, 0xC0A80502)
    assert tunnelprobes.inner_header(_frame(47, bytes.fromhex("10000800 00000009"), inner_eth=False), lab) is not None
    # a checksum the lab's tunnel does not send: another layout, not read at the wrong offset
    assert tunnelprobes.inner_header(_frame(47, bytes.fromhex("a0006558 abcd0000 00000005"), inner_eth=True), lab) is None
