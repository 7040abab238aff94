"""libvirt's save-image header read and rewritten for another instance's domain
(labctl.backends.libvirt.saveimage). The XML is the shape of one libvirt 9.0 kept for a
labctl guest (tests/integration/test_libvirt_class restores such rewritten copies for real)."""

from __future__ import annotations

import struct

import pytest

from labctl.backends.libvirt import saveimage

XML = """<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>labctl-room@ann-a</name>
  <uuid>967c8f08-72c5-40e5-91bf-4aeb18287326</uuid>
  <description>labctl run directory /run/labctl/labs/room@ann/guests/a</description>
  <sysinfo type='fwcfg'>
    <entry name='opt/labctl/host_key' file='/var/lib/libvirt/labctl/labctl-room@ann-a-host_key'/>
  </sysinfo>
  <devices>
    <disk type='file' device='disk'>
      <source file='/var/lib/libvirt/labctl/labctl-room@ann-a-disk.qcow2'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0'/>
    </disk>
  </devices>
  <qemu:commandline>
    <qemu:arg value='user,id=mgmt,restrict=on,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:43027-:22'/>
    <qemu:arg value='socket,id=gdb0,path=/var/lib/libvirt/labctl-run/labctl-room@ann-a/gdb.sock,server=on'/>
    <qemu:arg value='unix-dgram,local=/var/lib/libvirt/labctl-run/room@ann.net/0-a.sock'/>
  </qemu:commandline>
</domain>
"""
COOKIE = b"<cookie>\n  <slirpHelper/>\n</cookie>\n"
STREAM = b"QEVM\x00\x00\x00\x03" + bytes(range(256)) * 4


def _image(xml: str = XML, data_len: int = 8192, fmt: int = 0, magic: bytes = saveimage.MAGIC) -> bytes:
    body = xml.encode() + b"\0" + COOKIE + b"\0"
    head = struct.pack("<16s5I", magic, 2, data_len, 1, fmt, len(xml.encode()) + 1) + b"\0" * 56
    return head + body + b"\0" * (data_len - len(body)) + STREAM


def test_a_header_is_read_as_libvirt_wrote_it() -> None:
    h = saveimage.parse(_image())
    assert (h.version, h.data_len, h.was_running, h.format) == (2, 8192, 1, 0)
    assert (h.xml, h.cookie, h.size) == (XML, COOKIE, 92 + 8192)


def test_a_rewritten_header_names_the_other_instance_and_keeps_the_stream_where_it_was() -> None:
    image = _image()
    h = saveimage.parse(image)
    xml = saveimage.retarget(h.xml, "room@ann", "room@bea", 40001, "00000000-0000-4000-8000-000000000001")
    copy = saveimage.rewrite(h, xml) + image[h.size:]
    assert len(copy) == len(image) and copy.endswith(STREAM)
    again = saveimage.parse(copy)
    assert (again.data_len, again.was_running, again.cookie) == (h.data_len, 1, COOKIE)
    assert "ann" not in again.xml
    assert "<name>labctl-room@bea-a</name>" in again.xml
    assert "<uuid>00000000-0000-4000-8000-000000000001</uuid>" in again.xml
    assert "hostfwd=tcp:127.0.0.1:40001-:22" in again.xml
    assert "/labctl-run/room@bea.net/0-a.sock" in again.xml
    assert "labctl-room@bea-a-disk.qcow2" in again.xml and "slot='0x02'" in again.xml  # libvirt's own kept


def test_without_a_uuid_given_each_copy_gets_a_new_one() -> None:
    a = saveimage.retarget(XML, "room@ann", "room@bea", 1)
    b = saveimage.retarget(XML, "room@ann", "room@bea", 1)
    assert a != b and "967c8f08" not in a + b


def test_shape_ignores_the_instance_its_uuid_and_port_only() -> None:
    bea = saveimage.retarget(XML, "room@ann", "room@bea", 50000)
    assert saveimage.shape(XML, "room@ann") == saveimage.shape(bea, "room@bea")
    bigger = bea.replace("slot='0x02'", "slot='0x03'")
    assert saveimage.shape(XML, "room@ann") != saveimage.shape(bigger, "room@bea")


@pytest.mark.parametrize(("image", "words"), [
    (_image(magic=b"LibvirtQemudPart"), "not a complete libvirt save image"),
    (_image(fmt=1), "compressed"),
    (_image()[:500], "needs 8284 bytes"),
    (b"short", "shorter than"),
])
def test_what_cannot_be_rewritten_is_refused_with_why(image: bytes, words: str) -> None:
    with pytest.raises(saveimage.SaveImageError, match=words):
        saveimage.parse(image)


def test_an_xml_that_does_not_fit_the_room_libvirt_left_is_refused() -> None:
    h = saveimage.parse(_image(data_len=len(XML) + len(COOKIE) + 2))
    with pytest.raises(saveimage.SaveImageError, match="has room for"):
        saveimage.rewrite(h, XML + " " * 10)


def test_a_domain_of_another_instance_is_refused() -> None:
    with pytest.raises(saveimage.SaveImageError, match="not one of instance room@cid"):
        saveimage.retarget(XML, "room@cid", "room@bea", 1)
