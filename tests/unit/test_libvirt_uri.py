"""libvirt URIs read as libvirt reads them (issue 19, item 1): the query split on
both '&' and ';', names and values percent-decoded, every parameter on a short
allow-list; a lab file may give ``keyfile`` alone, never a program, a socket or
``no_verify``."""

from __future__ import annotations

import pytest

from labctl.errors import LabFileError
from labctl.lab import load_lab_text
from labctl.lab.uri import parse_uri, with_no_verify

REPRO_COMMAND = "qemu+ssh://127.0.0.1/system?keyfile=/k;command=/path/prog"
REPRO_NO_VERIFY = "qemu+ssh://127.0.0.1/system?keyfile=/k;no_verify=1"


@pytest.mark.parametrize(("query", "params"), [
    ("", []),
    ("keyfile=/k&no_verify=1", [("keyfile", "/k"), ("no_verify", "1")]),
    # ';' separates where no '&' follows (virURIParseParams looks for '&' first)
    ("keyfile=/k;command=/p", [("keyfile", "/k"), ("command", "/p")]),
    ("a=1;b=2;c=3", [("a", "1"), ("b", "2"), ("c", "3")]),
    ("keyfile=/k;command=/p&x=1", [("keyfile", "/k;command=/p"), ("x", "1")]),
    ("keyfile=/k;command=/p&", [("keyfile", "/k;command=/p")]),
    # names and values are percent-decoded after splitting; '+' stays '+'
    ("comm%61nd=/p", [("command", "/p")]),
    ("keyfile=/a%26b%3Bc+d", [("keyfile", "/a&b;c+d")]),
    ("k%00x=1", [("k\x00x", "1")]),
    # empty sections skipped, a bare name has an empty value, "=value" is ignored, "=" an empty name
    ("&&;name", [("name", "")]),
    ("name=", [("name", "")]),
    ("=x", []),
    ("=", [("", "")]),
])
def test_params_are_split_and_decoded_as_libvirt_does(query: str, params: list[tuple[str, str]]) -> None:
    from labctl.lab.uri import libvirt_params

    assert libvirt_params(query) == params


def test_the_issues_reproductions_are_refused_everywhere() -> None:
    for lab in (False, True):  # not even $LABCTL_LIBVIRT_URI may name a program
        with pytest.raises(ValueError, match="parameters labctl does not pass on: command"):
            parse_uri(REPRO_COMMAND, lab=lab)
    with pytest.raises(ValueError, match="cannot switch off host key checks"):
        parse_uri(REPRO_NO_VERIFY, lab=True)
    with pytest.raises(ValueError, match="';' in its query"):
        parse_uri(REPRO_NO_VERIFY)


@pytest.mark.parametrize(("uri", "why"), [
    ("qemu+ssh://h/system?comm%61nd=/p", "not pass on: command"),
    ("qemu+ssh://h/system?keyfile=/k&COMMAND=/p", "not pass on: COMMAND"),
    ("qemu+ssh://h/system?netcat=/p", "not pass on: netcat"),
    ("qemu+unix:///system?socket=/tmp/s", "not pass on: socket"),
    ("qemu+ssh://h/system?pkipath=/tmp", "not pass on: pkipath"),
    ("qemu+ssh://h/system?keyfile=/k;command=/p&", "';' in its query"),
    ("qemu+ssh://h/system?keyfile=/k&keyfile=/j", "keyfile more than once"),
    ("qemu+ssh://h/system?=", "not pass on: ''"),
    ("qemu+ssh://h/system?keyfile=/k%00/x", "control characters"),
    ("qemu+ssh://h/system?keyfile=k", "absolute path"),
    ("qemu+ext:///system?command=/p", "unsupported libvirt URI"),
    ("qemu+libssh://h/system", "unsupported libvirt URI"),
    ("QEMU+SSH://h/system", "unsupported libvirt URI"),
    ("qemu+ssh://h/system#?command=/p", "fragment"),
    ("qemu+ssh://h/system?keyfile=/a b", "RFC 3986"),
    ("qemu+ssh://h/system?keyfile=/k\n", "RFC 3986"),  # urlsplit would drop the newline; libvirt would not
    ("\tqemu:///system", "RFC 3986"),
    ("qemu+ssh://h/system?keyfile=/k%zz", "RFC 3986"),
    ("qemu+ssh://u:pw@h/system", "invalid user name 'u:pw'"),
    ("qemu+ssh://h:0/system", "invalid port"),
    ("qemu+ssh://h:/system", "expected \\[user@\\]host\\[:port\\]"),
    ("qemu+ssh://h/system;command=/p", "must end in /system"),
])
def test_what_libvirt_could_read_otherwise_is_refused(uri: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_uri(uri)


def test_what_stays_accepted() -> None:
    from labctl.lab.uri import LAB_PARAMS, PARAMS

    assert LAB_PARAMS == ("keyfile",) and PARAMS == ("keyfile", "no_verify")
    uri = parse_uri("qemu+ssh://root@127.0.0.1:2222/system?keyfile=/k/id", lab=True)
    assert (uri.user, uri.host, uri.port, uri.params) == ("root", "127.0.0.1", 2222, {"keyfile": "/k/id"})
    assert parse_uri("qemu+ssh://[::1]/session").host == "::1"
    assert parse_uri("qemu+unix:///system").params == {}
    hop = parse_uri(with_no_verify("qemu+ssh://h/system?keyfile=/k")).ssh_hop()
    assert hop is not None and hop.no_verify and hop.keyfile == "/k"


@pytest.mark.parametrize(("uri", "why"), [
    (REPRO_COMMAND, "parameters labctl does not pass on: command"),
    (REPRO_NO_VERIFY, "cannot switch off host key checks"),
    ("qemu+ssh://127.0.0.1/system?keyfile=/k&no%5Fverify=1", "cannot switch off host key checks"),
])
def test_a_lab_file_naming_them_is_refused_at_its_line(uri: str, why: str) -> None:
    text = f'name: t\nhosts:\n  h2: {{uri: "{uri}"}}\nnetworks: {{}}\nguests:\n  a: {{}}\n'
    with pytest.raises(LabFileError) as info:
        load_lab_text(text, "t.yaml")
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (3, "hosts.h2.uri") and why in problem.message
    assert info.value.exit_code == 2
