"""Where a class's instances go over the lab's libvirt hosts (labctl.training.placement), as data."""

from __future__ import annotations

import pytest

from labctl.errors import HostError
from labctl.lab import load_lab_text
from labctl.lab.hosts import HostPlace, place_guests
from labctl.lab.model import Lab
from labctl.training.placement import candidates, need_mib, place

REMOTE = "qemu+ssh://root@127.0.0.1:2222/system"


def _lab(guests: str, nets: str = "{}") -> Lab:
    text = (f"name: t\nhosts:\n  h1: {{uri: \"qemu:///system\"}}\n  h2: {{uri: \"{REMOTE}\"}}\n"
            f"networks: {nets}\nguests:\n{guests}")
    return load_lab_text(text, "t.yaml")


def _free(mib: dict[str, int]):  # type: ignore[no-untyped-def]
    return lambda host: mib[host.name]


def test_instances_go_whole_to_the_host_with_most_left() -> None:
    lab = _lab("  a: {memory: 256}\n  b: {memory: 512}\n")
    assert need_mib(lab) == 256 + 512 + 2 * 64
    got = place(lab, ["s1", "s2", "s3", "s4"], _free({"h1": 4000, "h2": 2500}))
    assert got is not None
    # h1 4000 -> 3104 -> 2208; h2 2500 -> 1604: s1 h1, s2 h1 (3104 > 2500), s3 h2 (2500 > 2208), s4 h1
    assert got.hosts == {"s1": "h1", "s2": "h1", "s3": "h2", "s4": "h1"}
    assert got.on("h2") == ["s3"]
    placed = lab.with_instance("s3").placed_on("h2")
    assert {g.name: g.host for g in placed.guests.values()} == {"a": "h2", "b": "h2"}
    hosts = place_guests(placed, "qemu:///system")
    assert all(isinstance(h, HostPlace) and h.remote for h in hosts.values())


def test_equal_hosts_alternate_and_ties_go_to_the_first() -> None:
    lab = _lab("  a: {memory: 256}\n")
    got = place(lab, ["ann", "bea", "cid", "dan"], _free({"h1": 8000, "h2": 8000}))
    assert got is not None and got.hosts == {"ann": "h1", "bea": "h2", "cid": "h1", "dan": "h2"}


def test_a_student_who_fits_nowhere_is_refused_unless_overcommit() -> None:
    lab = _lab("  a: {memory: 1024}\n")
    with pytest.raises(HostError) as err:
        place(lab, ["s1", "s2", "s3"], _free({"h1": 1200, "h2": 1100}))
    assert err.value.exit_code == 3
    assert "student 's3' fits on none of the lab's hosts" in err.value.message
    assert "h1 112 MiB, h2 12 MiB" in err.value.message
    got = place(lab, ["s1", "s2", "s3"], _free({"h1": 1200, "h2": 1100}), overcommit=True)
    assert got is not None and got.hosts["s3"] == "h1"


def test_a_guest_with_its_own_host_stays_there() -> None:
    lab = _lab("  a: {memory: 256}\n  b: {memory: 256, host: h1}\n")
    assert need_mib(lab) == 256 + 64  # only a moves
    got = place(lab, ["s1"], _free({"h1": 100, "h2": 9000}))
    assert got is not None and got.hosts == {"s1": "h2"}
    placed = lab.with_instance("s1").placed_on("h2")
    assert {g.name: g.host for g in placed.guests.values()} == {"a": "h2", "b": "h1"}


def test_no_spreading_without_hosts_or_unplaced_guests() -> None:
    plain = load_lab_text("name: t\nbackend: libvirt\nnetworks: {}\nguests:\n  a: {}\n", "t.yaml")
    assert place(plain, ["s1"], _free({})) is None
    pinned = _lab("  a: {host: h2}\n")
    assert candidates(pinned) == [] and place(pinned, ["s1"], _free({})) is None


def test_a_network_of_three_keeps_instances_off_remote_hosts() -> None:
    nic = "nics: [{name: eth1, model: e1000, network: lan}]"
    lab = _lab(f"  a: {{{nic}}}\n  b: {{{nic}}}\n  c: {{{nic}}}\n", "{lan: {}}")
    assert candidates(lab) == ["h1"]
    got = place(lab, ["s1", "s2"], _free({"h1": 9000, "h2": 90000}))
    assert got is not None and set(got.hosts.values()) == {"h1"}


def test_placed_on_an_unknown_host_is_refused() -> None:
    with pytest.raises(ValueError, match="defines no host 'h9'"):
        _lab("  a: {}\n").placed_on("h9")


def test_no_candidate_host_leaves_the_guests_where_up_puts_them() -> None:
    nic = "nics: [{name: eth1, model: e1000, network: lan}]"
    text = (f"name: t\nhosts:\n  h2: {{uri: \"{REMOTE}\"}}\nnetworks: {{lan: {{}}}}\nguests:\n"
            f"  a: {{{nic}}}\n  b: {{{nic}}}\n  c: {{{nic}}}\n")
    lab = load_lab_text(text, "t.yaml")
    assert candidates(lab) == [] and place(lab, ["s1"], _free({"h2": 90000})) is None
