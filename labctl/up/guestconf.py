"""The configuration a guest's init reads from fw_cfg (``guest/init``), and how its init's failures
map back to the lab file.

One record per line; every token was validated (no quoting needed, nothing is evaluated)::

    hostname NAME
    nic MAC NAME ADDR/PREFIX|- [mtu=N] [queues=N]     the management NIC, then each lab NIC
    sshd standby
    bond ID NAME MODE MIIMON PRIMARY|- MEMBER,... [mtu=N]
    bridge ID NAME MEMBER,...
    vlan ID NAME PARENT VID
    sysctl ID PATH VALUE...                           PATH below /proc/sys; VALUE the rest of the line
    addr ID IFACE ADDR/PREFIX
    route ID DEST VIA|- DEV|- METRIC|-
    offloads NIC                                      say the NIC's VLAN offloads (its frames carry tags)
    dad wait                                          wait for duplicate address detection to end

Init makes bonds, bridges and VLANs, sets the sysctls, brings every lab interface up with its
addresses, waits for DAD when the guest has IPv6 addresses, then adds the routes; all before its
READY line, so a post-boot snapshot holds them and every restore (warm start, ``reset``) brings
them back as the boot left them. ``ID`` numbers the :class:`ConfigItem` a failure names:
``LABCTL-FAILED config ID: MESSAGE`` on the console becomes the lab file's ``FILE:LINE: path:
message`` (:func:`config_failures`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labctl.backends import MGMT_ADDR
from labctl.errors import Problem
from labctl.lab import MGMT_NIC, Address, Bond, Bridge, Guest, Nic, Vlan


@dataclass(frozen=True)
class ConfigItem:
    """One setting the guest's init applies: where the lab file says it, and what it is."""

    line: int
    path: str
    what: str


class _Config:
    """Records and the items their IDs number, built in the order init applies them."""

    def __init__(self, guest: Guest) -> None:
        self.guest = guest
        self.items: list[ConfigItem] = []
        self.links: list[str] = []
        self.addrs: list[str] = []

    def item(self, line: int, path: str, what: str) -> int:
        self.items.append(ConfigItem(line, path, what))
        return len(self.items) - 1

    def addresses(self, name: str, addresses: tuple[Address, ...], line: int, path: str) -> None:
        for k, a in enumerate(addresses):
            where = f"{path}.ip" + (f"[{k}]" if len(addresses) > 1 else "")
            self.addrs.append(f"addr {self.item(line, where, f'address {a} on {name}')} {name} {a}")

    def vlans(self, parent: str, vlans: tuple[Vlan, ...], path: str) -> None:
        for j, v in enumerate(vlans):
            vpath = f"{path}.vlans[{j}]"
            self.links.append(f"vlan {self.item(v.line, vpath, f'VLAN {v.id} ({v.name}) on {parent}')} "
                              f"{v.name} {parent} {v.id}")
            self.addresses(v.name, v.addresses, v.line, vpath)

    def master(self, m: Bond | Bridge, mtu: int | None) -> None:
        path = f"guests.{self.guest.name}.{'bonds' if isinstance(m, Bond) else 'bridges'}.{m.name}"
        members = ",".join(m.members)
        if isinstance(m, Bond):
            ident = self.item(m.line, path, f"bond {m.name}")
            self.links.append(f"bond {ident} {m.name} {m.mode} {m.miimon} {m.primary or '-'} {members}"
                              + (f" mtu={mtu}" if mtu else ""))
        else:
            self.links.append(f"bridge {self.item(m.line, path, f'bridge {m.name}')} {m.name} {members}")
        self.addresses(m.name, m.addresses, m.line, path)
        self.vlans(m.name, m.vlans, path)

    def nic(self, nic: Nic) -> None:
        path = f"guests.{self.guest.name}.nics[{nic.index}]"
        self.addresses(nic.name, nic.addresses, nic.ip_line or nic.line, path)
        self.vlans(nic.name, nic.vlans, path)

    def settings(self) -> list[str]:
        g = self.guest
        for nic in g.nics:
            self.nic(nic)
        mtu = {n.name: n.mtu for n in g.nics}
        masters: list[Bond | Bridge] = [*g.bonds, *g.bridges]
        for m in masters:
            self.master(m, next((mtu[x] for x in m.members if mtu.get(x)), None) if isinstance(m, Bond) else None)
        sysctls = [f"sysctl {self.item(s.line, f'guests.{g.name}.sysctls.{s.name}', f'sysctl {s.name}')} "
                   f"{s.path} {s.value}" for s in g.sysctls]
        routes = [f"route {self.item(r.line, f'guests.{g.name}.routes[{k}]', f'route {r.text()}')} {r.to} "
                  f"{r.via or '-'} {r.dev or '-'} {'-' if r.metric is None else r.metric}"
                  for k, r in enumerate(g.routes)]
        dad = ["dad wait"] if any(a.version == 6 for _, addrs in g.interfaces() for a in addrs) else []
        offloads = [f"offloads {name}" for name in g.tagged_nics()]
        return [*self.links, *sysctls, *self.addrs, *routes, *offloads, *dad]


def items(guest: Guest) -> list[ConfigItem]:
    """The settings of ``guest`` its init applies, in the order their IDs number them."""
    conf = _Config(guest)
    conf.settings()
    return conf.items


def render(guest: Guest, mgmt_mac: str, standby_sshd: bool = False) -> str:
    """One record per line; every token was validated (no spaces, no quoting needed; a sysctl's
    value is the rest of its line).

    ``standby_sshd``: the boot is to become the post-boot snapshot and nothing logs in before
    it is taken: init starts no sshd that listens, only the standby that waits for its host key
    (``guest/init``; labctl hands it the guest's own key once the snapshot is taken).
    """
    lines = [f"hostname {guest.name}", f"nic {mgmt_mac} {MGMT_NIC} {MGMT_ADDR}"]
    if standby_sshd:
        lines.append("sshd standby")
    for nic in guest.nics:
        opts = []
        if nic.mtu:
            opts.append(f"mtu={nic.mtu}")
        if nic.queues > 1:
            opts.append(f"queues={nic.queues}")
        lines.append(" ".join(["nic", nic.mac, nic.name, "-", *opts]))
    lines += _Config(guest).settings()
    return "\n".join(lines) + "\n"


_FAILED = re.compile(rb"LABCTL-FAILED config (\d+): ([^\r\n]*)")


def config_failures(console: bytes, guest: Guest, source: str) -> list[Problem]:
    """The settings the guest's init reported failing on its console, as lab-file problems (empty:
    none); a message is guest text, kept as one line."""
    known = items(guest)
    out = []
    for m in _FAILED.finditer(console):
        index = int(m.group(1))
        if index < len(known):
            item = known[index]
            message = m.group(2).decode(errors="replace").strip()
            out.append(Problem(source, item.line, item.path, f"guest {guest.name}: {item.what}: {message}"))
    return out


_OFFLOADS = re.compile(rb"LABCTL-OFFLOADS ([A-Za-z0-9_.-]{1,15})((?: [a-z-]+=[a-z]+(?:,fixed)?)*)[ \r]*$", re.MULTILINE)


def offloads(console: bytes) -> dict[str, dict[str, str]]:
    """NIC -> its VLAN offloads (``rx-vlan-offload`` -> ``on`` or ``off [fixed]``) from a console's
    ``LABCTL-OFFLOADS NIC feature=on[,fixed]...`` lines (the last one of a NIC wins)."""
    out: dict[str, dict[str, str]] = {}
    for m in _OFFLOADS.finditer(console):
        feats = {}
        for word in m.group(2).decode().split():
            name, _, value = word.partition("=")
            state, _, fixed = value.partition(",")
            feats[name] = state + (" [fixed]" if fixed else "")
        out[m.group(1).decode()] = feats
    return out
