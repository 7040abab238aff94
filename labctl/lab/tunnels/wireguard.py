"""WireGuard: IP over encrypted UDP, to one peer (a wireguard tunnel of another guest of the lab).

::

    wg0: {type: wireguard, peer: b.wg0, remote: 10.2.0.2, ip: 10.99.0.1/24}   # port: 51820, allowed_ips: [...]

``peer`` names the other end as ``GUEST.TUNNEL``; ``remote`` is the address this end sends to (one
end at least says where the other is; WireGuard learns the rest); ``port`` the UDP port this end
listens on (its peer sends there); ``allowed_ips`` what the peer may send and is sent to (default:
the subnets of the peer's tunnel addresses). The key pairs are made by ``labctl up`` for each
instance and each ``up`` (never the same twice, never in the lab's state, a bundle or a pack; files
0600 in the lab's run directory), and handed to the guests once they are up (:mod:`labctl.up.tunsetup`).
"""

from __future__ import annotations

import ipaddress
import re

import labctl.lab.tunnels.fields as o
from labctl.lab.checker import Checker, describe, join
from labctl.lab.tunnels.devices import Kind, Tunnel
from labctl.lab.tunnels.framing import LAYER3, Framing, Site
from labctl.lab.yamlpos import YamlMap, YamlSeq

PORT = 51820
# handed to wg_xmit (its device's start_xmit, at the inner IPv4 or IPv6 header: skb->protocol says
# which) and encrypted after; decrypted, its source checked against the peer's allowed IPs
# (wg_allowedips_lookup_src, the receive path's one call out of receive.c: skb->data at the inner
# header, skb->dev the tunnel's device, skb->protocol set) before it is handed to the device. The
# outer packet, encrypted, is never matched.
FRAMING = Framing("wg", "WireGuard", 17, 0, Site("wg_xmit", "%di", 0), Site("wg_allowedips_lookup_src", "%si", 0),
                  encrypted=True, families=LAYER3)
PEER = re.compile(r"[a-z][a-z0-9-]{0,31}\.[a-zA-Z][a-zA-Z0-9_.-]{0,14}")


class Wireguard(Kind):
    name = "wireguard"
    keys = ("peer", "remote", "port", "allowed_ips")
    required = ("peer",)
    framings = (FRAMING,)

    def options(self, check: Checker, m: YamlMap, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        peer = check.string(m, "peer", path, required=True)
        if peer is not None and not PEER.fullmatch(peer):
            check.add(m.value_line("peer"), join(path, "peer"),
                      f"invalid peer '{peer}' (write GUEST.TUNNEL: the wireguard tunnel of the other end)")
            peer = None
        o.put(out, "peer", peer)
        o.put(out, "remote", o.address(check, m, "remote", path))
        o.put(out, "port", o.port(check, m, "port", path) or PORT)
        o.put(out, "allowed_ips", _allowed(check, m, path))
        return out

    def link(self, t: Tunnel) -> list[str]:
        return ["ip", "link", "add", t.name, "type", "wireguard"]

    def describe(self, t: Tunnel) -> str:
        to = f" at {t.opt('remote')}" if t.opt("remote") else ""
        return f"wireguard to {t.opt('peer')}{to}, port {t.opt('port') or PORT}"


def _allowed(check: Checker, m: YamlMap, path: str) -> str | None:
    value, where = m.get("allowed_ips"), join(path, "allowed_ips")
    if value is None:
        return None
    if not isinstance(value, YamlSeq) or not value:
        check.add(m.value_line("allowed_ips"), where, f"expected a list of prefixes, got {describe(value)}")
        return None
    nets = []
    for i, v in enumerate(value):
        try:
            nets.append(str(ipaddress.ip_network(str(v), strict=True)))
        except ValueError:
            check.add(value.item_line(i), f"{where}[{i}]", f"invalid prefix '{v}' (host bits clear: 10.9.0.0/24)")
    return ",".join(nets) if len(nets) == len(value) else None


KIND = Wireguard()
