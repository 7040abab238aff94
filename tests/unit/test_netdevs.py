"""Each netdev kind (labctl.net.netdevs): its -netdev option, the device's options, what a restart
needs, and a registry that owns every kind of local end a port can have."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from labctl.net import NETDEVS, Port, TapDev, UdpAddr, kind_of_option, netdev_kind, option_id


def _port(local: Path | UdpAddr | TapDev, remote: Path | UdpAddr | None = None) -> Port:
    return Port("a", "eth1", "lan", local, remote)


def test_every_kind_of_local_end_has_a_netdev_kind() -> None:
    samples = {Path: Path("/run/n0-a-1.sock"), UdpAddr: UdpAddr("10.0.0.1", 4000), TapDev: TapDev("lt0m0", "lb0", 1)}
    ends = typing.get_args(typing.get_type_hints(Port)["local"])
    assert set(ends) == set(samples), "a new kind of port: add a NetdevKind to labctl.net.netdevs.NETDEVS"
    assert {netdev_kind(_port(samples[t])).name for t in ends} == {"dgram", "tap"}
    assert len({k.prefix for k in NETDEVS}) == len(NETDEVS)


def test_a_dgram_link_names_both_ends_escaped() -> None:
    port = _port(Path("/run/a,b/n0-a-1.sock"), Path("/run/n0-switch.sock"))
    kind = netdev_kind(port)
    assert kind.netdev("lab0", port) == ("dgram,id=lab0,local.type=unix,local.path=/run/a,,b/n0-a-1.sock,"
                                         "remote.type=unix,remote.path=/run/n0-switch.sock")
    tunnel = _port(UdpAddr("192.0.2.1", 4000), UdpAddr("192.0.2.2", 4001))
    assert kind.netdev("lab1", tunnel) == ("dgram,id=lab1,local.type=inet,local.host=192.0.2.1,local.port=4000,"
                                           "remote.type=inet,remote.host=192.0.2.2,remote.port=4001")
    assert netdev_kind(_port(Path("/run/x.sock"))).netdev("lab2", _port(Path("/run/x.sock"))) == \
        "dgram,id=lab2,local.type=unix,local.path=/run/x.sock"
    assert kind.kept("lab0", port) is None and kind.fds(port) == () and not kind.opened_by_labctl
    assert kind.device_options(port, multiqueue=True) == ""


def test_a_tap_is_its_inherited_queues_and_is_kept_for_a_restart() -> None:
    one, four = _port(TapDev("lt0m0", "lb0", 1, (7,))), _port(TapDev("lt0m1", "lb0", 4, (8, 9, 10, 11)))
    kind = netdev_kind(four)
    assert kind.netdev("lab0", one) == "tap,id=lab0,fd=7,vhost=off"
    assert kind.netdev("lab1", four) == "tap,id=lab1,fds=8:9:10:11,vhost=off"
    assert kind.device_options(four, multiqueue=True) == ",mq=on,vectors=10"
    assert kind.device_options(four, multiqueue=False) == ""  # e1000: one queue whatever the tap has
    assert kind.device_options(one, multiqueue=True) == ""
    assert kind.fds(four) == (8, 9, 10, 11)
    assert kind.kept("lab1", four) == {"netdev": "lab1", "name": "lt0m1", "bridge": "lb0", "queues": 4}
    assert kind.reattach("tap,id=lab1,fds=8:9:10:11,vhost=off", (20, 21)) == "tap,id=lab1,fds=20:21,vhost=off"
    assert kind.reattach("tap,id=lab0,fd=7,vhost=off", (22,)) == "tap,id=lab0,fd=22,vhost=off"


@pytest.mark.parametrize(("option", "kind", "ident"), [
    ("tap,id=lab0,fd=7,vhost=off", "tap", "lab0"),
    ("dgram,id=lab3,local.type=unix,local.path=/x", "dgram", "lab3"),
    ("user,id=mgmt,restrict=on", None, "mgmt"),
])
def test_an_option_is_told_by_its_kind(option: str, kind: str | None, ident: str) -> None:
    found = kind_of_option(option)
    assert (found.name if found else None) == kind
    assert option_id(option) == ident
