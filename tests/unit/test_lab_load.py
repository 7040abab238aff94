"""Tests for labctl.lab.load / validate / model: resolved values of valid labs."""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
from pathlib import Path

import pytest

from labctl.errors import LabFileError, Problem
from labctl.lab import NIC_MODELS, Lab, default_mac, load_lab, load_lab_text
from labctl.lab.validate import parse_ip

VALID = Path(__file__).resolve().parents[2] / "tests" / "labs" / "valid"


def _mac(seed: str) -> str:
    """Reference implementation of the default MAC (no bumping)."""
    return "52:54:00:" + ":".join(f"{b:02x}" for b in hashlib.sha256(seed.encode()).digest()[:3])


@pytest.fixture(scope="module")
def three() -> Lab:
    return load_lab(VALID / "three-nics.yaml")


@pytest.fixture(scope="module")
def options() -> Lab:
    return load_lab(VALID / "options.yaml")


def test_three_nics_header(three: Lab) -> None:
    assert (three.name, three.image, three.backend) == ("three-nics", "debian-12", "qemu")
    assert three.description == "three guests, three NIC models, one LAN"
    assert three.source == str(VALID / "three-nics.yaml")
    data = (VALID / "three-nics.yaml").read_bytes()
    assert three.sha256 == hashlib.sha256(data).hexdigest()
    assert three.text == data.decode()


def test_three_nics_guests_and_defaults(three: Lab) -> None:
    assert list(three.guests) == ["a", "b", "c"]
    models = {name: guest.nics[0].model for name, guest in three.guests.items()}
    assert models == {"a": "rtl8139", "b": "e1000", "c": "virtio-net-pci"}
    for guest in three.guests.values():
        assert (guest.memory, guest.cpus, guest.kernel_args) == (512, 1, ())
        assert len(guest.nics) == 1
    c = three.guests["c"].nic("eth1")
    assert c.queues == 2
    assert c.ip == ipaddress.IPv4Interface("10.10.0.3/24")
    assert c.nic_model is NIC_MODELS["virtio-net-pci"]
    assert three.guests["a"].nics[0].queues == 1
    assert three.guests["a"].nics[0].mtu is None
    assert three.guests["a"].line == 8


def test_three_nics_macs_are_stable(three: Lab) -> None:
    macs = [guest.nics[0].mac for guest in three.guests.values()]
    assert macs == ["52:54:00:af:74:c6", "52:54:00:51:9b:e8", "52:54:00:2d:68:91"]
    assert macs == [_mac(f"three-nics/{g}/eth1") for g in "abc"]


def test_three_nics_network_members(three: Lab) -> None:
    lan = three.networks["lan"]
    assert lan.members == (("a", "eth1"), ("b", "eth1"), ("c", "eth1"))
    assert lan.mtu is None


def test_options_header_and_guests(options: Lab) -> None:
    assert (options.name, options.image, options.backend) == ("options_lab-2", "debian-12.5", "libvirt")
    assert list(options.guests) == ["r1", "h1", "h2", "idle"]
    r1 = options.guests["r1"]
    assert (r1.memory, r1.cpus) == (1024, 2)
    assert r1.kernel_args == ("console=ttyS0", "net.ifnames=0", "quiet")
    assert options.guests["h1"].kernel_args == ("loglevel=7", "dyndbg=file net/* +p")
    idle = options.guests["idle"]
    assert (idle.memory, idle.cpus, idle.nics) == (512, 1, ())


def test_options_nics(options: Lab) -> None:
    left0, right10 = options.guests["r1"].nics
    assert (left0.model, left0.queues, left0.mtu, left0.index) == ("virtio-net-pci", 4, 9000, 0)
    assert (right10.name, right10.mac) == ("right.10", "52:54:00:ab:cd:01")
    assert (right10.mtu, right10.index) == (1400, 1)
    merged, eth2 = options.guests["h1"].nics
    assert (merged.name, merged.model, merged.network, merged.queues) == ("eth1", "virtio-net-pci", "left", 1)
    assert str(merged.ip) == "192.168.1.2/24"
    assert eth2.mac == "52:54:00:12:34:56"  # unquoted MAC survives YAML 1.1 base-60
    assert options.guests["h2"].nics[1].ip is None
    assert options.guests["h2"].nics[2].mac == _mac("options_lab-2/h2/eth3")


def test_options_networks(options: Lab) -> None:
    assert list(options.networks) == ["left", "right", "unused"]
    left = options.networks["left"]
    assert (left.mtu, left.description) == (9000, "jumbo side")
    assert left.members == (("r1", "left0"), ("h1", "eth1"), ("h2", "eth1"), ("h2", "eth3"))
    assert options.networks["right"].members == (("r1", "right.10"), ("h1", "eth2"), ("h2", "eth2"))
    assert options.networks["unused"].members == ()


def test_default_mac_bumps_past_taken_macs() -> None:
    lab = load_lab(VALID / "mac-bump.yaml")
    assert lab.guests["a"].nics[0].mac == _mac("bump/b/eth1")
    assert lab.guests["b"].nics[0].mac == _mac("bump/b/eth1#1")
    assert default_mac("bump", "b", "eth1") == _mac("bump/b/eth1")
    taken = {_mac("x/y/z"), _mac("x/y/z#1")}
    assert default_mac("x", "y", "z", taken) == _mac("x/y/z#2")


def test_to_dict_is_json_serialisable(three: Lab) -> None:
    data = json.loads(json.dumps(three.to_dict()))
    assert data["guests"]["a"]["nics"][0]["ip"] == "10.10.0.1/24"
    assert data["networks"]["lan"]["members"] == [["a", "eth1"], ["b", "eth1"], ["c", "eth1"]]
    assert data["sha256"] == three.sha256
    assert "text" not in data


def test_model_is_frozen(three: Lab) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        three.name = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        three.guests["a"].nics[0].mac = "x"  # type: ignore[misc]


def test_load_lab_text_matches_load_lab(three: Lab) -> None:
    text = (VALID / "three-nics.yaml").read_text()
    lab = load_lab_text(text, "inline.yaml")
    assert lab.source == "inline.yaml"
    assert lab.sha256 == three.sha256
    assert lab.to_dict()["guests"] == three.to_dict()["guests"]


def test_minimal_lab() -> None:
    lab = load_lab_text("name: m\nnetworks:\nguests:\n  solo:\n", "m.yaml")
    assert list(lab.guests) == ["solo"]
    assert lab.networks == {}


def test_missing_file_is_a_lab_file_error() -> None:
    missing = VALID / "does-not-exist.yaml"
    with pytest.raises(LabFileError) as info:
        load_lab(missing)
    assert info.value.problems == [
        Problem(str(missing), 1, "", "cannot read lab file: No such file or directory")
    ]


def test_directory_is_a_lab_file_error() -> None:
    with pytest.raises(LabFileError) as info:
        load_lab(VALID)
    assert info.value.problems[0].line == 1
    assert info.value.problems[0].message.startswith("cannot read lab file: ")


def test_all_problems_are_collected() -> None:
    text = "name: x\nnetworks: {}\nguests:\n  a: {memory: 1}\n  b: {cpus: 9}\n"
    with pytest.raises(LabFileError) as info:
        load_lab_text(text, "x.yaml")
    assert [(p.line, p.path) for p in info.value.problems] == [(4, "guests.a.memory"), (5, "guests.b.cpus")]


@pytest.mark.parametrize("text", ["10.1.2.3/32", "10.1.2.0/31", "10.1.2.1/255.255.255.0", "169.254.1.1/16"])
def test_parse_ip_accepts(text: str) -> None:
    assert isinstance(parse_ip(text), ipaddress.IPv4Interface)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.1.2.3", "missing prefix length in '10.1.2.3' (e.g. 10.1.2.3/24)"),
        ("banana", "invalid IPv4 address 'banana'"),
        ("10.1.2.3/", "invalid prefix length in '10.1.2.3/' (expected 0..32)"),
        ("0.0.0.1/8", "0.0.0.1 is not a usable host address"),
        ("250.1.1.1/8", "250.1.1.1 is not a usable host address"),
        ("10.0.2.2/30", "10.0.2.2 is in 10.0.2.0/24, reserved for labctl's management network"),
        ("10.0.0.5/8", "10.0.0.5/8 overlaps 10.0.2.0/24, reserved for labctl's management network"),
    ],
)
def test_parse_ip_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_ip(text)
    assert str(info.value) == message


@pytest.mark.parametrize("name", ["x/../..", "..", ".", "a.b", "a/b", "-a", "_a", "A", "a" * 33, "a b", "a@b"])
def test_a_lab_name_that_is_not_a_plain_directory_name_is_refused(name: str) -> None:
    """A lab's name is its run directory's name: ``labctl down NAME`` removes it, so a name with
    ``/`` or ``.`` must never validate."""
    with pytest.raises(LabFileError) as err:
        load_lab_text(f"name: {json.dumps(name)}\nnetworks: {{}}\nguests:\n  solo: {{}}\n", "n.yaml")
    assert any(p.path == "name" and p.line == 1 for p in err.value.problems), err.value.problems


@pytest.mark.parametrize("name", ["a", "lab-1", "x_y", "0", "a" * 32])
def test_plain_lab_names_pass(name: str) -> None:
    assert load_lab_text(f"name: {json.dumps(name)}\nnetworks: {{}}\nguests:\n  solo: {{}}\n", "n.yaml").name == name
