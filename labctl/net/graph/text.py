"""The topology as text other tools draw: Graphviz DOT (:func:`to_dot`) and a Mermaid flowchart (:func:`to_mermaid`)."""

from __future__ import annotations

from labctl.net.graph.nodes import GuestNode, NetworkNode, NicRow, Topology
from labctl.net.graph.style import BAD_BG, BAR_COLOR, FAILED_COLOR, FONT, HEAD, INK, MUTED, WARN, XML_BAD
from labctl.net.graph.style import xml_text as _x

# --------------------------------------------------------------------------- Graphviz

def _dot_str(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + XML_BAD.sub("", text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _h(text: str) -> str:
    """Text for a DOT HTML-like label."""
    return _x(text)


def _dot_guest(guest: GuestNode) -> str:
    color = FAILED_COLOR if guest.crashed else BAR_COLOR
    head = f"<B>{_h(guest.name)}</B>"
    sub = " · ".join(t for t in (guest.info_text, guest.state or "") if t)
    if sub:
        head += f'<BR/><FONT POINT-SIZE="9" COLOR="{MUTED}">{_h(sub)}</FONT>'
    rows = [f'<TR><TD ALIGN="LEFT" BGCOLOR="{BAD_BG if guest.crashed else HEAD}">{head}</TD></TR>']
    for i, nic in enumerate(guest.nics):
        line1 = f"<B>{_h(nic.name)}</B> {_h(nic.model)}"
        if nic.driver:
            line1 += f' <FONT COLOR="{BAR_COLOR}">· {_h(nic.driver)}</FONT>'
        marks = [m for m, on in (("pcap", nic.captured), ("link down", nic.down)) if on]
        if marks:
            line1 += f' <FONT COLOR="{FAILED_COLOR if nic.down else BAR_COLOR}">[{_h(", ".join(marks))}]</FONT>'
        cell = f'{line1}<BR ALIGN="LEFT"/><FONT COLOR="{MUTED}">{_h(nic.address_text)}</FONT><BR ALIGN="LEFT"/>'
        if nic.impairments:
            cell += f'<FONT COLOR="{WARN}">{_h(nic.impairment_text)}</FONT><BR ALIGN="LEFT"/>'
        cell += "".join(f'<FONT COLOR="{BAR_COLOR}">{_h(v.text)}</FONT><BR ALIGN="LEFT"/>' for v in nic.vlans)
        rows.append(f'<TR><TD PORT="p{i}" ALIGN="LEFT" BALIGN="LEFT">{cell}</TD></TR>')
    for m in guest.masters:
        cell = f'<B>{_h(m.title)}</B><BR ALIGN="LEFT"/><FONT COLOR="{MUTED}">{_h(m.address_text)}</FONT><BR ALIGN="LEFT"/>'
        cell += "".join(f'<FONT COLOR="{BAR_COLOR}">{_h(v.text)}</FONT><BR ALIGN="LEFT"/>' for v in m.vlans)
        rows.append(f'<TR><TD ALIGN="LEFT" BALIGN="LEFT">{cell}</TD></TR>')
    table = (f'<TABLE BORDER="{2 if guest.crashed else 1}" CELLBORDER="0" CELLSPACING="0" CELLPADDING="4" '
             f'COLOR="{color}">' + "".join(rows) + "</TABLE>")
    return f"  {_dot_str('guest:' + guest.name)} [shape=plain, label=<{table}>];"


def _dot_net(net: NetworkNode) -> str:
    label = f"<B>{_h(net.name)}</B>" + (' <FONT COLOR="#3b6ea8">[pcap]</FONT>' if net.captured else "")
    for line in net.detail_lines:
        label += f'<BR/><FONT POINT-SIZE="9" COLOR="{MUTED}">{_h(line)}</FONT>'
    return (f"  {_dot_str('net:' + net.name)} [shape=box, style=\"rounded,filled\", fillcolor=\"{HEAD}\", "
            f'color="{BAR_COLOR}", label=<{label}>];')


def to_dot(topo: Topology) -> str:
    """The topology as a Graphviz ``graph``: one HTML-like table node per guest (a port per NIC),
    one node per network, one edge per NIC. Render with ``dot -Tsvg``."""
    out = [f"graph {_dot_str(topo.name)} {{",
           (f'  graph [rankdir=LR, nodesep=0.3, ranksep=1.2, fontname="{FONT}", fontsize=12, labelloc=t, '
            f"label=<<B>lab {_h(topo.name)}</B>>];"),
           f'  node [fontname="{FONT}", fontsize=11, fontcolor="{INK}"];',
           f'  edge [color="{BAR_COLOR}", penwidth=1.4, fontname="{FONT}", fontsize=10];']
    out += [_dot_guest(g) for g in topo.guests]
    out += [_dot_net(n) for n in topo.networks]
    for g in topo.guests:
        for i, nic in enumerate(g.nics):
            attrs = []
            if nic.down:
                attrs += ["style=dashed", f'color="{FAILED_COLOR}"']
            if nic.impairments:
                attrs.append(f'label=<<FONT COLOR="{WARN}">{_h(nic.impairment_text)}</FONT>>')
            tail = f"{_dot_str('guest:' + g.name)}:p{i}:e"
            edge = f"  {tail} -- {_dot_str('net:' + nic.network)}"
            out.append(edge + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    out.append("}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- Mermaid

_MERMAID_ENTITIES = {"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "&": "#amp;", "|": "#124;",
                     "`": "#96;", "\n": " ", "\r": " "}


def _m(text: str) -> str:
    """Text for a quoted Mermaid label: special characters as Mermaid entity codes."""
    return "".join(_MERMAID_ENTITIES.get(c, c) for c in XML_BAD.sub("", text))


def to_mermaid(topo: Topology) -> str:
    """The topology as a Mermaid ``flowchart LR``: a subgraph per guest holding a node per NIC,
    a node per network, a link per NIC (dashed and red when down, labelled with impairments)."""
    out = ["flowchart LR"]
    net_ids = {n.name: f"net{i}" for i, n in enumerate(topo.networks)}
    links: list[tuple[str, str, NicRow]] = []
    members: list[str] = []  # a bond's or bridge's member NICs, dotted (after the network links)
    styles: list[str] = []
    for gi, g in enumerate(topo.guests):
        gid = f"g{gi}"
        head = " · ".join(t for t in (g.name, g.info_text, g.state or "") if t)
        out.append(f'  subgraph {gid}["{_m(head)}"]')
        for ni, nic in enumerate(g.nics):
            line1 = " ".join(t for t in (nic.name, nic.model, nic.driver and f"· {nic.driver}",
                                         "[pcap]" if nic.captured else "", "[link down]" if nic.down else "") if t)
            vlans = "".join(f"<br/>{_m(v.text)}" for v in nic.vlans)
            out.append(f'    {gid}n{ni}["{_m(line1)}<br/>{_m(nic.address_text)}{vlans}"]')
            links.append((f"{gid}n{ni}", nic.network, nic))
        if not g.nics:
            out.append(f'    {gid}none["{_m("no lab NICs")}"]')
        for mi, m in enumerate(g.masters):
            vlans = "".join(f"<br/>{_m(v.text)}" for v in m.vlans)
            out.append(f'    {gid}m{mi}[["{_m(m.title)}<br/>{_m(m.address_text)}{vlans}"]]')
            members += [f"  {gid}n{ni} -.- {gid}m{mi}" for ni, nic in enumerate(g.nics) if nic.name in m.members]
        out.append("  end")
        if g.crashed:
            styles.append(f"  style {gid} fill:{BAD_BG},stroke:{FAILED_COLOR},stroke-width:2px")
    for n in topo.networks:
        label = _m(n.name + (" [pcap]" if n.captured else "")) + "".join(f"<br/>{_m(t)}" for t in n.detail_lines)
        out.append(f'  {net_ids[n.name]}(["{label}"])')
    for k, (src, net, nic) in enumerate(links):
        label = f'|"{_m(nic.impairment_text)}"|' if nic.impairments else ""
        arrow = "-.-" if nic.down else "---"
        out.append(f"  {src} {arrow}{label} {net_ids.get(net, 'net_missing')}")
        if nic.down:
            styles.append(f"  linkStyle {k} stroke:{FAILED_COLOR},stroke-width:2px")
    return "\n".join(out + members + styles) + "\n"
