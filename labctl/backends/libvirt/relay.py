"""Copies a libvirt guest's serial console into ``console.log`` in its run directory.

Run as ``python -m labctl.backends.libvirt.relay URI UUID LOG``. It opens
the domain's console through libvirt (``virDomainOpenConsole``, a
``virStream`` over the same connection as everything else), creates ``LOG``
(mode 0600) once it is attached, and appends everything the guest prints,
until the domain goes away (the stream ends) or it gets SIGTERM. ``up``
starts the domain paused and resumes it only once ``LOG`` exists, so no
boot line is lost. The backend owns this process and stops it at ``down``.

Every guest's console goes this way, on a remote host or on this machine:
QEMU runs as its own unprivileged user and writes nothing into labctl's run
directory, and labctl reads no file from a directory QEMU could write to.
"""

from __future__ import annotations

import os
import sys

CHUNK = 65536
ATTACHED = "console relay attached"


def relay(uri: str, uuid: str, log_path: str) -> int:
    """Attach to the console and copy it to ``log_path``; 0 when the domain ended."""
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        conn = libvirt.open(uri)
        dom = conn.lookupByUUIDString(uuid)
        stream = conn.newStream(0)
        dom.openConsole(None, stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
    except libvirt.libvirtError as exc:
        print(f"cannot open the console of domain {uuid} at {uri}: {exc}", file=sys.stderr)
        return 1
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    print(ATTACHED, file=sys.stderr, flush=True)  # a relay that appends to a LOG that exists says so here
    try:
        while True:
            try:
                data = stream.recv(CHUNK)
            except libvirt.libvirtError:
                return 0  # the domain was destroyed under the stream
            if not data or isinstance(data, int):
                return 0
            os.write(fd, data)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m labctl.backends.libvirt.relay URI UUID LOG", file=sys.stderr)
        return 2
    return relay(*argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
