"""Topology pictures: SVG, DOT and Mermaid from a resolved lab and optional runtime facts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from labctl.lab import load_lab_text
from labctl.net.graph import (
    Topology,
    planned_mechanism,
    runtime_from_state,
    to_dot,
    to_mermaid,
    to_svg,
    topology,
)

ROOT = Path(__file__).resolve().parents[2]
LAB_FILES = sorted((ROOT / "labs").glob("*.yaml")) + sorted((ROOT / "tests" / "labs" / "valid").glob("*.yaml"))
RED = "#b42318"

SWITCHED = """
name: switched
networks:
  lan: {mtu: 9000}
  wan: {}
guests:
  a:
    nics:
      - {name: eth1, model: rtl8139, network: lan, ip: 10.1.0.1/24}
      - {name: eth2, model: e1000e, network: wan, ip: 10.2.0.1/24}
  b:
    nics: [{name: eth1, model: e1000, network: lan, ip: 10.1.0.2/24}]
  c:
    nics: [{name: eth1, model: virtio-net-pci, network: lan, ip: 10.1.0.3/24, queues: 2}]
  d:
    nics: [{name: eth1, model: pcnet, network: wan, ip: 10.2.0.2/24}]
"""

HOSTS = """
name: hosted
hosts:
  h1: {uri: "qemu:///system"}
  h2: {uri: "qemu+ssh://root@lab2/system", address: 192.0.2.10}
networks:
  tun: {}
  same: {}
guests:
  a:
    host: h1
    nics:
      - {name: eth1, model: e1000, network: tun, ip: 10.20.0.1/24}
      - {name: eth2, model: rtl8139, network: same, ip: 10.21.0.1/24}
  b:
    host: h2
    nics: [{name: eth1, model: virtio-net-pci, network: tun, ip: 10.20.0.2/24}]
  c:
    host: h1
    nics: [{name: eth1, model: e1000, network: same, ip: 10.21.0.2/24}]
"""

LONG_GUEST = "g" + "x" * 30  # 31 characters, the longest guest name
LONG_NET = "n" + "y" * 31  # 32 characters, the longest network name
ODD_DESC = 'Tom & Jerry\'s <b>"lan"</b> & more, described at some length so that it must be shortened'
ODD = f"""
name: odd
description: 'a <lab> & "quotes"'
networks:
  {LONG_NET}: {{description: '{ODD_DESC.replace("'", "''")}'}}
guests:
  {LONG_GUEST}:
    nics: [{{name: verylongifname1, model: virtio-net-pci, network: {LONG_NET}, ip: 10.9.0.1/24}}]
  b:
    nics: [{{name: eth1, model: ne2k_pci, network: {LONG_NET}}}]
"""



def _address_shown(guest: dict, nic: dict) -> str:  # type: ignore[type-arg]
    """What a NIC row says of its address: its first one, ``in bond0`` for a member, else ``no address``."""
    masters = [m["name"] for m in (*guest.get("bonds", []), *guest.get("bridges", [])) if nic["name"] in m["members"]]
    return f"in {masters[0]}" if masters else nic["ip"] or "no address"

def lab_dict(text: str, name: str = "lab.yaml") -> dict[str, Any]:
    return load_lab_text(text, name).to_dict()


def parse(svg: str) -> ET.Element:
    """The SVG's root with namespaces stripped from tags."""
    root = ET.fromstring(svg)
    for el in root.iter():
        el.tag = el.tag.rsplit("}", 1)[-1]
    return root


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter("text")]


def all_text(root: ET.Element) -> str:
    return "\n".join("".join(el.itertext()) for el in root.iter() if el.tag in ("text", "title"))


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [el for el in root.iter() if cls in el.get("class", "").split()]


def links(root: ET.Element) -> list[ET.Element]:
    return [el for el in root.iter("path") if "link" in el.get("class", "").split()]


def ends(path: ET.Element) -> tuple[float, float, float, float]:
    nums = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
    return nums[0], nums[1], nums[-2], nums[-1]


def runtime_marks() -> dict[str, Any]:
    return {
        "guests": {
            "a": {"state": "running", "nics": {"eth1": {"driver": "8139cp", "capture": True,
                                                         "impairments": {"loss": "1%", "delay": "20ms"}},
                                                "eth2": {"driver": "e1000e", "link": "up"}}},
            "b": {"state": "crashed", "nics": {"eth1": {"driver": "e1000", "link": "down"}}},
            "c": {"nics": {"eth1": {"driver": "virtio_net"}}},
        },
        "networks": {"wan": {"capture": True, "mechanism": "unix-dgram"}},
    }


# --------------------------------------------------------------------------- every lab, every fact

@pytest.mark.parametrize("path", LAB_FILES, ids=lambda p: p.stem)
def test_svg_of_every_lab_shows_every_guest_nic_model_address_and_network(path: Path) -> None:
    lab = lab_dict(path.read_text(), str(path))
    for standalone in (True, False):
        root = parse(to_svg(topology(lab), standalone=standalone))
        shown = texts(root)
        words = " ".join(shown).split()
        for name, guest in lab["guests"].items():
            assert name in shown
            for nic in guest["nics"]:
                assert nic["name"] in words and nic["model"] in words
                assert _address_shown(guest, nic) in " ".join(shown)
        for name in lab["networks"]:
            assert name in shown
        n_nics = sum(len(g["nics"]) for g in lab["guests"].values())
        assert len(links(root)) == n_nics
        assert len(by_class(root, "guest")) == len(lab["guests"])
        assert len(by_class(root, "network")) == len(lab["networks"])
        assert not by_class(root, "pcap") and not by_class(root, "down") and not by_class(root, "legend")


@pytest.mark.parametrize("path", LAB_FILES, ids=lambda p: p.stem)
def test_links_join_each_nic_row_to_its_network_without_crossings(path: Path) -> None:
    lab = lab_dict(path.read_text(), str(path))
    root = parse(to_svg(topology(lab)))
    rects = {}
    for g in by_class(root, "network"):
        r = g.find("rect")
        assert r is not None
        rects[g.get("data-network")] = tuple(float(r.get(k, "")) for k in ("x", "y", "width", "height"))
    per_net: dict[tuple[str | None, bool], list[tuple[float, float]]] = {}
    for p in links(root):
        net = p.get("data-network")
        nic = lab["guests"][p.get("data-guest")]["nics"]
        assert net in [n["network"] for n in nic if n["name"] == p.get("data-nic")]
        _, y1, x2, y2 = ends(p)
        x, y, w, h = rects[net]
        assert x2 in (pytest.approx(x), pytest.approx(x + w)) and y <= y2 <= y + h
        per_net.setdefault((net, x2 == pytest.approx(x)), []).append((y1, y2))
    for pairs in per_net.values():  # links into one side of a network keep their order
        assert sorted(pairs) == sorted(pairs, key=lambda t: t[1])
    if path.parent.name == "labs":  # the bundled labs are drawn without any crossing
        assert crossings(root) == 0


def crossings(root: ET.Element) -> int:
    """Pairs of links on the same side of the network column whose ends are in opposite order."""
    segments = [(ends(p)[1], ends(p)[3], ends(p)[0] < ends(p)[2]) for p in links(root)]
    return sum(1 for i, (a1, a2, sa) in enumerate(segments) for b1, b2, sb in segments[i + 1:]
               if sa == sb and (a1 - b1) * (a2 - b2) < 0)


def test_ordering_removes_crossings_the_lab_order_would_have() -> None:
    # lab order puts n1 on top, but its members are listed last on both sides
    lab = {"name": "order", "networks": {"n1": {}, "n2": {}},
           "guests": {g: {"nics": [{"name": "eth1", "model": "e1000", "network": net, "ip": f"10.0.0.{i}/24"}]}
                      for i, (g, net) in enumerate([("a", "n2"), ("b", "n2"), ("c", "n1"), ("d", "n1")])}}
    root = parse(to_svg(topology(lab)))
    assert crossings(root) == 0
    names = [g.get("data-network") for g in by_class(root, "network")]
    ys = {name: box[1] for name, box in zip(names, boxes(root, "network"), strict=True)}
    assert ys["n2"] < ys["n1"]


def test_three_guest_network_is_a_switch_and_mtu_and_queues_are_shown() -> None:
    topo = topology(lab_dict(SWITCHED))
    assert topo.network("lan").mechanism == "switch" and topo.network("wan").mechanism == "unix-dgram"
    assert topo.network("lan").members == (("a", "eth1"), ("b", "eth1"), ("c", "eth1"))
    root = parse(to_svg(topo))
    shown = texts(root)
    assert "labctl L2 switch" in shown and "direct link (unix-dgram)" in shown and "mtu 9000" in shown
    assert "10.1.0.3/24 · mtu 9000 · 2 queues" in shown and "10.2.0.1/24" in shown
    lan = [p.get("data-guest", "") for p in links(root) if p.get("data-network") == "lan"]
    assert sorted(lan) == ["a", "b", "c"]


def test_hosts_are_shown_and_give_the_planned_mechanisms() -> None:
    topo = topology(lab_dict(HOSTS))
    assert topo.network("tun").mechanism == "udp-tunnel"  # across hosts
    assert topo.network("same").mechanism == "unix-dgram"  # both on h1 (local)
    assert [g.host for g in topo.guests] == ["h1", "h2", "h1"]
    shown = texts(parse(to_svg(topo)))
    assert "UDP tunnel" in shown
    assert sum(t.startswith("host h1 ·") for t in shown) == 2 and sum(t.startswith("host h2 ·") for t in shown) == 1
    # a lab without hosts does not print the default host on every guest
    assert "host local" not in to_svg(topology(lab_dict(SWITCHED)))


def test_planned_mechanism() -> None:
    local = {"a": None, "b": None, "c": None}
    assert planned_mechanism([("a", "e")], local, {}) == "alone"
    assert planned_mechanism([], local, {}) == "alone"
    assert planned_mechanism([("a", "e"), ("b", "e")], local, {}) == "unix-dgram"
    assert planned_mechanism([("a", "e"), ("b", "e"), ("c", "e")], local, {}) == "switch"
    remote = {"r": "qemu+ssh://lab2/system"}
    assert planned_mechanism([("a", "e"), ("b", "e")], {"a": "r", "b": "r"}, remote) == "udp-tunnel"
    assert planned_mechanism([("a", "e"), ("b", "e"), ("c", "e")], {"a": "r", "b": "r", "c": "r"}, remote) is None


def test_odd_characters_and_long_names_are_escaped_and_shortened() -> None:
    topo = topology(lab_dict(ODD))
    svg = to_svg(topo)
    root = parse(svg)
    assert "<b>" not in svg and '"lan"' not in svg and "& " not in svg
    titles = [t.text or "" for t in root.iter("title")]
    assert any(ODD_DESC in t for t in titles)  # the whole description in the tooltip
    assert any(t.startswith("Tom & Jerry's <b>") and t.endswith("…") for t in texts(root))
    assert 'a <lab> & "quotes"' in texts(root)
    shown = " ".join(texts(root))
    assert LONG_GUEST in shown and LONG_NET in shown and "verylongifname1" in shown
    assert "no address" in shown  # b.eth1 has no ip
    assert {g.get("data-guest") for g in by_class(root, "guest")} == {LONG_GUEST, "b"}
    width = float(root.get("width", ""))
    for el in root.iter("rect"):
        assert float(el.get("x", "")) + float(el.get("width", "")) <= width


def test_hostile_names_outside_validation_are_escaped_in_every_format() -> None:
    evil = '<x&"y\'>#|`'
    lab = {"name": f"lab{evil}", "description": evil,
           "networks": {f"n{evil}": {"description": evil}},
           "guests": {f"g{evil}": {"nics": [{"name": f"e{evil}", "model": f"m{evil}", "network": f"n{evil}",
                                             "ip": evil}]}}}
    topo = topology(lab, {"guests": {f"g{evil}": {"state": evil, "nics": {f"e{evil}": {
        "driver": evil, "impairments": {evil: evil}, "capture": True, "link": "down"}}}}})
    svg = to_svg(topo, standalone=False)
    root = parse(svg)
    assert evil in all_text(root)
    assert {g.get("data-guest") for g in by_class(root, "guest")} == {f"g{evil}"}
    assert "<x" not in svg
    for ident in (el.get("id") for el in root.iter() if el.get("id")):
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", ident or "")
    dot = to_dot(topo)
    check_dot_syntax(dot)
    assert "&lt;x&amp;&quot;y" in dot and 'graph "lab<x&\\"y' in dot  # HTML labels / quoted ids
    mermaid = to_mermaid(topo)
    for line in mermaid.splitlines():
        assert "<x" not in line and line.count('"') % 2 == 0
    assert "#lt;x#amp;#quot;y'#gt;#35;#124;#96;" in mermaid


# --------------------------------------------------------------------------- runtime marks

def test_runtime_marks_appear_exactly_where_given() -> None:
    topo = topology(lab_dict(SWITCHED), runtime_marks())
    root = parse(to_svg(topo))
    nic_pcap = [(b.get("data-guest"), b.get("data-nic")) for b in by_class(root, "pcap")
                if b.get("data-nic") is not None]
    net_pcap = [b.get("data-network") for b in by_class(root, "pcap") if b.get("data-network")]
    assert nic_pcap == [("a", "eth1")] and net_pcap == ["wan"]
    impair = [el for el in root.iter("text") if "impair" in el.get("class", "")]
    assert ["".join(t.itertext()) for t in impair] == ["delay 20ms · loss 1%"]  # canonical order
    nic_a = next(g for g in by_class(root, "nic") if (g.get("data-guest"), g.get("data-nic")) == ("a", "eth1"))
    assert impair[0] in list(nic_a.iter())
    down = [p for p in links(root) if p.get("stroke-dasharray")]
    assert [(p.get("data-guest"), p.get("data-nic")) for p in down] == [("b", "eth1")]
    assert down[0].get("stroke") == RED and "down" in down[0].get("class", "").split()
    assert all(p.get("stroke") != RED for p in links(root) if p not in down)
    assert [b.get("data-guest") for b in by_class(root, "down") if b.tag == "g"] == ["b"]
    crashed = by_class(root, "crashed")
    assert [g.get("data-guest") for g in crashed] == ["b"]
    assert any(r.get("stroke") == RED for r in crashed[0].iter("rect"))
    shown = " ".join(texts(root))
    assert "8139cp" in shown and "virtio_net" in shown and "crashed" in shown and "running" in shown
    assert len(by_class(root, "legend")) == 1
    assert topo.network("wan").mechanism == "unix-dgram"


def test_runtime_marks_in_dot_and_mermaid() -> None:
    topo = topology(lab_dict(SWITCHED), runtime_marks())
    dot = to_dot(topo)
    edges = [line for line in dot.splitlines() if " -- " in line]
    assert [e for e in edges if "style=dashed" in e] == [e for e in edges if e.lstrip().startswith('"guest:b"')]
    assert RED in next(e for e in edges if "style=dashed" in e)
    assert sum("delay 20ms · loss 1%" in e for e in edges) == 1
    assert dot.count("[pcap]") == 2
    mermaid = to_mermaid(topo).splitlines()
    edge_lines = [m for m in mermaid if re.match(r"\s+g\d+n\d+ ", m)]
    down = [i for i, m in enumerate(edge_lines) if "-.-" in m]
    assert len(down) == 1 and edge_lines[down[0]].split()[0] == "g1n0"
    assert f"  linkStyle {down[0]} stroke:{RED},stroke-width:2px" in mermaid
    assert any(m.strip().startswith("style g1 ") for m in mermaid)
    assert sum('|"delay 20ms · loss 1%"|' in m for m in edge_lines) == 1


def test_runtime_is_optional_and_tolerant() -> None:
    lab = lab_dict(SWITCHED)
    plain = to_svg(topology(lab))
    runtimes: list[Any] = [None, {}, {"guests": None, "networks": []}, {"guests": {"a": "x", "b": {"nics": ["eth1"]}}},
                           {"guests": {"a": {"nics": {"eth1": None}}}, "networks": {"lan": 3}},
                           {"guests": {"zz": {"state": "running"}}, "networks": {"nope": {"capture": True}}}]
    for rt in runtimes:
        assert to_svg(topology(lab, rt)) == plain
    odd = topology(lab, {"guests": {"a": {"state": 7, "nics": {"eth1": {
        "link": False, "capture": "yes", "driver": ["x"],
        "impairments": {"loss": None, "rate": "1mbit", "dup": True}}}}}})
    nic = odd.guest("a").nics[0]
    assert nic.down and nic.captured and nic.driver is None and nic.impairment_text == "rate 1mbit · dup"
    assert odd.guest("a").state == "7"
    assert topology({}).guests == () and "no guests" in to_svg(topology({}))
    partial = topology({"guests": {"x": {"nics": [{"name": "eth1", "network": "ghost"}]}}})
    assert [n.name for n in partial.networks] == ["ghost"] and partial.network("ghost").members == (("x", "eth1"),)
    ET.fromstring(to_svg(partial))


def test_runtime_from_state() -> None:
    rt = runtime_from_state(drivers={"a": {"eth1": "8139cp", "eth2": ""}},
                            networks={"lan": {"mechanism": "switch", "ports": []}, "x": {}},
                            hosts={"b": {"name": "h2", "uri": "qemu:///system"}}, states={"a": "crashed"})
    assert rt == {"guests": {"a": {"nics": {"eth1": {"driver": "8139cp"}}, "state": "crashed"},
                             "b": {"nics": {}, "host": "h2"}},
                  "networks": {"lan": {"mechanism": "switch"}}}
    topo = topology(lab_dict(SWITCHED), rt)
    assert topo.guest("a").nics[0].driver == "8139cp" and topo.guest("a").crashed and topo.guest("b").host == "h2"
    assert runtime_from_state() == {"guests": {}, "networks": {}}


# --------------------------------------------------------------------------- SVG output form

def test_svg_is_deterministic() -> None:
    a = to_svg(topology(lab_dict(SWITCHED), runtime_marks()))
    b = to_svg(topology(lab_dict(SWITCHED), runtime_marks()))
    assert a == b
    # dict order of impairments does not matter either
    rt: dict[str, Any] = runtime_marks()
    rt["guests"]["a"]["nics"]["eth1"]["impairments"] = {"delay": "20ms", "loss": "1%"}
    assert to_svg(topology(lab_dict(SWITCHED), rt)) == a


def test_standalone_and_inline_differ_only_in_the_envelope() -> None:
    topo = topology(lab_dict(SWITCHED), runtime_marks())
    standalone, inline = to_svg(topo), to_svg(topo, standalone=False)
    assert standalone.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" ')
    assert inline.startswith("<svg ") and "xmlns" not in inline and "<?xml" not in inline
    assert re.findall(r"\w+://", standalone) == ["http://"] and "://" not in inline
    assert standalone.replace('<?xml version="1.0" encoding="UTF-8"?>\n', "").replace(
        ' xmlns="http://www.w3.org/2000/svg"', "").rstrip("\n") == inline
    assert ET.fromstring(standalone).tag == "{http://www.w3.org/2000/svg}svg" and ET.fromstring(inline).tag == "svg"
    for svg in (standalone, inline):
        low = svg.lower()
        assert "<script" not in low and "href" not in low and "url(" not in low and " on" not in re.sub(
            r">[^<]*<", "><", low)


def test_id_prefix_keeps_ids_unique_across_pictures() -> None:
    topo = topology(lab_dict(SWITCHED))
    ids = []
    for prefix in ("first", "second"):
        root = parse(to_svg(topo, standalone=False, id_prefix=prefix))
        mine = [el.get("id") or "" for el in root.iter() if el.get("id")]
        assert mine and all(i == prefix or i.startswith(prefix + "-") for i in mine)
        assert len(mine) == len(set(mine)) == 1 + len(topo.guests) + len(topo.networks)
        ids += mine
    assert len(ids) == len(set(ids))
    assert parse(to_svg(topo, id_prefix="1 bad<")).get("id") == "t1_bad_"


def big_lab(guests: int = 12, networks: int = 8) -> dict[str, Any]:
    nets = {f"net{i}": {"mtu": 9000 if i % 3 == 0 else None} for i in range(networks)}
    g = {f"guest-{i:02d}": {"memory": 512, "cpus": 2, "nics": [
        {"name": f"eth{j}", "model": "e1000", "network": f"net{(i * 3 + j * 5) % networks}",
         "ip": f"10.{i}.{j}.1/24"} for j in range(1 + i % 3)]} for i in range(guests)}
    return {"name": "big", "networks": nets, "guests": g}


def boxes(root: ET.Element, cls: str) -> list[tuple[float, float, float, float]]:
    out = []
    for g in by_class(root, cls):
        r = g.find("rect")
        assert r is not None
        out.append(tuple(float(r.get(k, "")) for k in ("x", "y", "width", "height")))
    return out  # type: ignore[return-value]


def overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def test_big_lab_grows_the_canvas_without_overlaps() -> None:
    small = parse(to_svg(topology(lab_dict(SWITCHED))))
    root = parse(to_svg(topology(big_lab())))
    width, height = float(root.get("width", "")), float(root.get("height", ""))
    assert height > float(small.get("height", "")) * 2
    assert root.get("viewBox") == f"0 0 {width:.0f} {height:.0f}"
    placed = boxes(root, "guest") + boxes(root, "network")
    assert len(placed) == 20
    for i, a in enumerate(placed):
        assert a[0] >= 0 and a[1] >= 0 and a[0] + a[2] <= width and a[1] + a[3] <= height
        for b in placed[i + 1:]:
            assert not overlap(a, b)
    assert len(links(root)) == sum(1 + i % 3 for i in range(12))
    assert {f"guest-{i:02d}" for i in range(12)} <= set(texts(root))


# --------------------------------------------------------------------------- DOT and Mermaid

def check_dot_syntax(dot: str) -> None:
    """Quoted strings terminated, <...> HTML labels and {...} balanced outside strings."""
    depth_brace = depth_angle = 0
    i = 0
    while i < len(dot):
        c = dot[i]
        if depth_angle == 0 and c == '"':
            j = i + 1
            while j < len(dot) and dot[j] != '"':
                assert dot[j] != "\n", "newline inside a quoted string"
                j += 2 if dot[j] == "\\" else 1
            assert j < len(dot), "unterminated string"
            i = j
        elif c == "<":
            depth_angle += 1
        elif c == ">":
            depth_angle -= 1
            assert depth_angle >= 0
        elif depth_angle == 0 and c in "{}":
            depth_brace += 1 if c == "{" else -1
            assert depth_brace >= 0
        i += 1
    assert depth_brace == 0 and depth_angle == 0


def dot_nodes(dot: str) -> list[str]:
    return re.findall(r'^\s*"((?:guest|net):[^"]*)" \[', dot, re.MULTILINE)


@pytest.mark.parametrize("path", LAB_FILES, ids=lambda p: p.stem)
def test_dot_has_one_node_per_guest_and_network_and_an_edge_per_nic(path: Path) -> None:
    lab = lab_dict(path.read_text(), str(path))
    dot = to_dot(topology(lab))
    check_dot_syntax(dot)
    assert dot.startswith(f'graph "{lab["name"]}" {{') and dot.rstrip().endswith("}")
    assert dot_nodes(dot) == [f"guest:{g}" for g in lab["guests"]] + [f"net:{n}" for n in lab["networks"]]
    edges = re.findall(r'^\s*"guest:([^"]*)":p(\d+):e -- "net:([^"]*)"', dot, re.MULTILINE)
    expected = [(g, str(i), nic["network"]) for g, guest in lab["guests"].items()
                for i, nic in enumerate(guest["nics"])]
    assert edges == expected
    for guest in lab["guests"].values():
        for i, nic in enumerate(guest["nics"]):
            assert f'PORT="p{i}"' in dot and nic["model"] in dot and _address_shown(guest, nic) in dot


@pytest.mark.parametrize("path", LAB_FILES, ids=lambda p: p.stem)
def test_mermaid_declares_every_node_and_edge(path: Path) -> None:
    lab = lab_dict(path.read_text(), str(path))
    mermaid = to_mermaid(topology(lab))
    lines = mermaid.splitlines()
    assert lines[0] == "flowchart LR"
    subgraphs = re.findall(r'^\s*subgraph (g\d+)\["([^"]*)"\]$', mermaid, re.MULTILINE)
    assert [label.split(" · ")[0] for _, label in subgraphs] == list(lab["guests"])
    assert mermaid.count("\n  end\n") == len(lab["guests"])
    nets = dict(re.findall(r'^\s*(net\d+)\(\["([^"<]*)', mermaid, re.MULTILINE))
    assert list(nets.values()) == list(lab["networks"])
    net_id = {name: ident for ident, name in nets.items()}
    nic_nodes = dict(re.findall(r'^\s*(g\d+n\d+)\["([^"]*)"\]$', mermaid, re.MULTILINE))
    edges = re.findall(r"^\s*(g\d+n\d+) --- (net\d+)$", mermaid, re.MULTILINE)
    assert len(edges) == len(nic_nodes) == sum(len(g["nics"]) for g in lab["guests"].values())
    for gi, (g, guest) in enumerate(lab["guests"].items()):
        for ni, nic in enumerate(guest["nics"]):
            label = nic_nodes[f"g{gi}n{ni}"]
            assert nic["name"] in label and nic["model"] in label and _address_shown(guest, nic) in label
            assert (f"g{gi}n{ni}", net_id[nic["network"]]) in edges


def test_topology_accepts_a_lab_object_too() -> None:
    lab = load_lab_text(SWITCHED, "lab.yaml")
    assert isinstance(topology(lab), Topology)
    assert to_svg(topology(lab)) == to_svg(topology(lab.to_dict()))
