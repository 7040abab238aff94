"""labctl serve --cert FILE --key FILE: the trainer's own certificate is the one a client gets,
verified against it, and its printed fingerprint is that certificate's (no guest needed)."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
from pathlib import Path

import httpx

from tests.conftest import Cli
from tests.integration.test_web_tools import read_serve, token


def _make_pair(d: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (0644 and 0600)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    c, k = d / f"{name}.crt", d / f"{name}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    os.chmod(c, 0o644)
    os.chmod(k, 0o600)
    return c, k


def test_serve_with_the_trainers_certificate(cli: Cli, tmp_path: Path) -> None:
    d = tmp_path / "tls"
    d.mkdir(mode=0o700)
    cert, key = _make_pair(d, "trainer-cert")
    with cli.running("serve", "--listen", "127.0.0.1:0", "--cert", str(cert), "--key", str(key)) as serve:
        got = read_serve(serve, {"base", "owner", "fingerprint"})
        base = got["base"]
        assert base.startswith("https://127.0.0.1:")
        host, port = base.removeprefix("https://").rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=str(cert))
        with socket.create_connection((host, int(port)), timeout=30) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        want = hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()
        assert hashlib.sha256(der).hexdigest() == want
        assert got["fingerprint"].replace(":", "").lower() == want
        with httpx.Client(base_url=base, verify=ctx, timeout=30) as client:
            r = client.get(f"/?t={token(got['owner'])}", follow_redirects=False)
            assert r.status_code == 303 and "Secure" in r.headers["set-cookie"]
            assert client.get("/api/index").status_code == 200
    os.chmod(key, 0o640)  # and the CLI refuses a key others may read
    res = cli("serve", "--listen", "127.0.0.1:0", "--cert", str(cert), "--key", str(key), timeout=60)
    assert res.returncode == 2 and "readable by other users" in res.stderr and "Traceback" not in res.stderr
