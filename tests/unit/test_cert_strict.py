"""Every certificate the controller makes is strict X.509 (issue 35): `openssl verify -x509_strict` with the purpose
of its role, and a real TLS handshake through a Python context with Python 3.13's default flags
(`VERIFY_X509_STRICT | VERIFY_X509_PARTIAL_CHAIN`: cpython's Lib/ssl.py create_default_context since 3.13).

Certificates made before this (no Subject/Authority Key Identifier; an empty subject with a non-critical
subjectAltName) fail both: OpenSSL 3.0 says "Missing Authority Key Identifier" and "Subject name is empty" with
x509_strict, and the handshake ends with CERTIFICATE_VERIFY_FAILED.
"""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading

import pytest

from m3deploy.controller import tls
from m3deploy.core import internal_tls
from m3deploy.core.build import build
from m3deploy.core.inventory import InvHost

SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1", "m3_auth": True,
       "m3_edge": True, "m3_internal_tls": True, "m3_edge_frontends": 1}
# the whole of 127.0.0.0/8 is the loopback: each host its own address, so each certificate's SAN is checked
ADDR = {"ctl0": "127.0.0.1", "w0": "127.0.0.21", "w1": "127.0.0.22"}
STRICT = ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
PURPOSES = {"server": ("sslserver",), "peer": ("sslserver", "sslclient"), "client": ("sslclient",)}


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


def _plan():
    return build([InvHost(n, ("control",) if n.startswith("ctl") else ("workers",), {**SIM, "m3_address": a})
                  for n, a in ADDR.items()], name="strict")


def _certs(p) -> tuple[str, list[tuple[str, str, str, str, str]]]:
    """(the trust bundle, [(name, role, address, certificate, key)]) of every certificate the plan uses."""
    inner = tls.cluster_certs(p)
    data = tls.ensure_cluster_tls(p)
    out = [("edge", "server", ADDR["ctl0"], data[tls.EDGE_CERT], data[tls.EDGE_KEY])]
    for name, (address, who) in tls.wanted(p).items():
        out.append((name, tls.role(who), address, inner[f"tls-cert:{name}"], inner[f"tls-key:{name}"]))
    return inner[internal_tls.CA_REF], out


def _private(path, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return str(path)


def _strict_client(ca: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.verify_flags |= STRICT
    return ctx


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, address: str) -> bytes:
    """A real TLS handshake on `address`: the server sends b"ok" once its side completed; its error re-raised."""
    sock = socket.create_server((address, 0))
    errors: list[BaseException] = []

    def serve():
        conn, _ = sock.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as c:
                c.sendall(b"ok")
        except (ssl.SSLError, OSError) as e:
            errors.append(e)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with socket.create_connection(sock.getsockname()[:2], timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname=address) as c:
            got = c.recv(2)
    finally:
        t.join(10)
        sock.close()
    if errors:
        raise errors[0]
    return got


def test_every_certificate_passes_openssl_x509_strict_with_its_purpose(tmp_path):
    ca_pem, certs = _certs(_plan())
    ca = tmp_path / "ca.pem"
    ca.write_text(ca_pem)
    for name, role, _, cert, _ in certs:
        leaf = tmp_path / f"{name.replace(':', '-')}.pem"
        leaf.write_text(cert)  # the certificate only: public
        for purpose in PURPOSES[role]:
            r = subprocess.run(["openssl", "verify", "-x509_strict", "-purpose", purpose, "-CAfile", str(ca),
                                str(leaf)], capture_output=True, text=True)
            assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (name, purpose, r.stdout + r.stderr)
        assert tls.strict_problems(tls.load_cert(cert)) == [], name
    assert tls.strict_problems(tls.load_cert(ca_pem)) == []


def test_every_certificate_completes_a_handshake_under_python_313_default_flags(tmp_path):
    ca_pem, certs = _certs(_plan())
    ca = _private(tmp_path / "ca.pem", ca_pem)
    edge = next(c for c in certs if c[0] == "edge")
    edge_files = (_private(tmp_path / "edge.crt", edge[3]), _private(tmp_path / "edge.key", edge[4]))
    for name, role, address, cert, key in certs:
        files = (_private(tmp_path / f"{name.replace(':', '-')}.crt", cert),
                 _private(tmp_path / f"{name.replace(':', '-')}.key", key)) if name != "edge" else edge_files
        if role in ("server", "peer"):  # it serves: a strict client verifies it and its address
            srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            srv.load_cert_chain(*files)
            assert _handshake(srv, _strict_client(ca), address) == b"ok", name
        if role in ("client", "peer"):  # it connects: a strict server that wants a client certificate takes it
            srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            srv.load_cert_chain(*edge_files)
            srv.verify_mode = ssl.CERT_REQUIRED
            srv.load_verify_locations(ca)
            srv.verify_flags |= STRICT
            cli = _strict_client(ca)
            cli.load_cert_chain(*files)
            assert _handshake(srv, cli, ADDR["ctl0"]) == b"ok", name


def test_a_strict_context_refuses_a_certificate_without_key_identifiers(tmp_path):
    """The check above can fail: a leaf made the old way (no AKI/SKI, empty subject, non-critical SAN) is refused."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    ca_pem, certs = _certs(_plan())
    data = tls.ensure_cluster_tls(_plan())
    ca_cert, ca_key = tls._signer(data)
    key = tls._key()
    now = tls.now_utc()
    old = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(ca_cert.subject)
           .public_key(key.public_key()).serial_number(x509.random_serial_number())
           .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=30))
           .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
           .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                          critical=False)
           .sign(ca_key, hashes.SHA256()))
    assert "no Authority Key Identifier" in tls.strict_problems(old)
    ca = _private(tmp_path / "ca.pem", ca_pem)
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(_private(tmp_path / "old.crt", tls._pem_cert(old)),
                        _private(tmp_path / "old.key", tls._pem_key(key)))
    assert _handshake(srv, ssl.create_default_context(cafile=ca), "127.0.0.1") == b"ok"  # without the strict flags
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(srv, _strict_client(ca), "127.0.0.1")
    r = subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", ca, str(tmp_path / "old.crt")],
                       capture_output=True, text=True)
    assert r.returncode != 0
