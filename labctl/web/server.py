"""Running the application: where it listens, its URLs and tokens, TLS, and uvicorn around it."""

from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labctl.errors import UnsafePath, UsageError
from labctl.paths import atomic_write, checked_dir, ensure_private_dir
from labctl.training import ClassRecord, class_names
from labctl.web.access import class_tokens, owner_token, web_dir, write_url_file

DEFAULT_PORT = 8470


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IP address; ``[v6]:PORT``; PORT 0 picks a free one).

    :raise UsageError: for anything else.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(DEFAULT_PORT)
    host = host.strip("[]") or "127.0.0.1"
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError as exc:
        raise UsageError(f"--listen {text!r}: give ADDRESS:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}") from exc
    if not 0 <= number <= 65535:
        raise UsageError(f"--listen {text!r}: the port must be 0-65535")
    return host, number


def bind(host: str, port: int) -> socket.socket:
    """A listening socket. :raise UsageError: when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def self_signed(host: str) -> tuple[Path, Path, str]:
    """A self-signed certificate for ``host`` (made once, kept 0600 in the web directory): its
    certificate and key files and its SHA-256 fingerprint."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = ensure_private_dir(web_dir())
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    if not (cert_path.is_file() and key_path.is_file()):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "labctl serve")])
        now = datetime.datetime.now(datetime.UTC)
        alt: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        with_host = ipaddress.ip_address(host)
        if not with_host.is_unspecified and str(with_host) != "127.0.0.1":
            alt.append(x509.IPAddress(with_host))
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=365))
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .sign(key, hashes.SHA256()))
        atomic_write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()), 0o600)
        atomic_write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o600)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    fp = cert.fingerprint(hashes.SHA256()).hex(":").upper()
    return cert_path, key_path, fp


PEM_LIMIT = 1 << 20


def _read_owned(path: Path, what: str, private: bool) -> bytes:
    """The bytes of the trainer's ``what`` file once it is safe to trust: its directory passes
    :func:`checked_dir`, it is a regular file (no link followed) of the user's or root's that
    nobody else may write, and (``private``) nobody else may read.

    :raise UsageError: naming what is wrong (exit 2).
    """
    try:
        real_dir = checked_dir(path.parent if str(path.parent) else Path("."))
    except UnsafePath as exc:
        raise UsageError(f"--{what} {path}: {exc.message}", hint=exc.hint) from exc
    except OSError as exc:
        raise UsageError(f"--{what} {path}: {exc.strerror or exc}") from exc
    try:
        fd = os.open(Path(real_dir) / path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise UsageError(f"--{what} {path}: cannot open it: {why}") from exc
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"--{what} {path} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise UsageError(f"--{what} {path} belongs to uid {st.st_uid}, not to you or root",
                             hint="use a file of your own")
        if mode & 0o022:
            raise UsageError(f"--{what} {path} is writable by other users (mode {mode:04o})",
                             hint=f"chmod go-w {path}")
        if private and mode & 0o077:
            raise UsageError(f"--{what} {path} is readable by other users (mode {mode:04o}): the key must be yours alone",
                             hint=f"chmod 600 {path}")
        data = os.read(fd, PEM_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > PEM_LIMIT:
        raise UsageError(f"--{what} {path} is more than {PEM_LIMIT // 1024} KiB: not a PEM file")
    return data


def own_certificate(cert: Path, key: Path) -> tuple[Path, Path, str]:
    """The trainer's certificate (PEM, its chain may follow) and unencrypted private key (PEM),
    checked (:func:`_read_owned`), matched, and copied 0600 into the web directory, which is
    what the server then reads (a file changed after the check is never used): the copies'
    paths and the certificate's SHA-256 fingerprint.

    :raise UsageError: for a file that is unsafe, unreadable, not PEM, or a key of another certificate.
    """
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization

    cert_pem = _read_owned(cert, "cert", private=False)
    key_pem = _read_owned(key, "key", private=True)
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as exc:
        raise UsageError(f"--cert {cert}: not a PEM certificate ({exc})") from exc
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError as exc:
        raise UsageError(f"--key {key}: the key is encrypted; give an unencrypted one (mode 0600)") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise UsageError(f"--key {key}: not a PEM private key") from exc
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*spki) != chain[0].public_key().public_bytes(*spki):
        raise UsageError(f"--key {key} is not the key of the certificate in {cert}")
    d = ensure_private_dir(web_dir())
    cert_copy, key_copy = d / "own-cert.pem", d / "own-key.pem"
    atomic_write(key_copy, key_pem, 0o600)
    atomic_write(cert_copy, cert_pem, 0o600)
    return cert_copy, key_copy, chain[0].fingerprint(hashes.SHA256()).hex(":").upper()


@dataclass
class Links:
    """What ``serve`` prints: the owner's URL, each class's trainer URL and students' URLs."""

    base: str
    owner: str
    classes: dict[str, dict[str, str]] = field(default_factory=dict)  # lab -> {"trainer": url, student: url}
    url_files: dict[str, str] = field(default_factory=dict)  # ident -> handout URL file


def links(base: str, labs: list[str] | None) -> Links:
    """Tokens made (or read) for the classes served, their URLs, each student's written into their
    handout directory. ``labs``: the classes to serve (None: every class up).

    :raise LabStateError: for a class named that is not up.
    """
    out = Links(base, f"{base}/?t={owner_token()}")
    for lab in (labs if labs is not None else class_names()):
        record = ClassRecord.load(lab)
        tokens = class_tokens(record)
        urls = {"trainer": f"{base}/?t={tokens.trainer}"}
        for student in record.students:
            urls[student] = f"{base}/?t={tokens.students[student]}"
            path = write_url_file(record, student, urls[student])
            if path is not None:
                out.url_files[record.ident(student)] = str(path)
        out.classes[lab] = urls
    return out


def run(sock: socket.socket, tls: tuple[Path, Path] | None = None) -> None:
    """Serve on ``sock`` until interrupted (uvicorn, no access log: the first URL holds a token)."""
    import uvicorn

    from labctl.web.app import build_app

    config = uvicorn.Config(build_app(), log_level="warning", access_log=False, ws="websockets",
                            ssl_certfile=str(tls[0]) if tls else None, ssl_keyfile=str(tls[1]) if tls else None,
                            lifespan="on", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
