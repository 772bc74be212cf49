"""TLS for the edge (m3deploy.core.edge): the user's certificate, or one from the cluster CA the controller keeps.

With m3_tls_cert_file + m3_tls_key_file (controller paths, both 0600) the edge serves that chain; our clients
trust m3_tls_ca_file, else the system's store. Without them the controller makes, once, a cluster CA (EC P-256,
10 years) and an edge certificate signed by it (2 years) naming every control host's address and m3_vip's; the
CA's key, the edge key and both certificates are kept in the secrets store (m3deploy.controller.secrets, 0600). The edge
certificate is made again only when the addresses it must name change, so a re-run changes nothing.
The CA certificate (public) is also written to `<config>/<cluster>/ca.pem`: what clients load (`ca_file`).

Made with the `cryptography` package (already a dependency: the etcd JWT key), not the openssl CLI: no key
ever passes through argv or a temporary file.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from m3deploy.controller import secrets as store
from m3deploy.controller.cachelock import locked
from m3deploy.core import internal_tls
from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import is_ip

CA_KEY, CA_CERT, EDGE_KEY, EDGE_CERT = "cluster-ca-key", "cluster-ca-cert", "edge-tls-key", "edge-tls-cert"
CA_REF = CA_CERT  # m3deploy.core.internal_tls.CA_REF: the TLS files' name of the CA's certificate


def _settings(plan) -> dict:
    return dict(plan.settings)


def edge_names(plan) -> list[str]:
    """What the edge certificate must name: every address an edge listens on (each control host's, and the
    cluster's own with m3_vip: the endpoint is one of them)."""
    return sorted({p.address for h in plan.hosts for s in h.services if s.kind == "edge" for p in s.ports})


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _pem_cert(cert) -> str:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _cert(subject: str, key, issuer_name, issuer_key, days: int, ca: bool, sans=(), usage=("server",)):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)] if subject else [])
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
    else:
        alt = [x509.IPAddress(ipaddress.ip_address(a)) if is_ip(a) else x509.DNSName(a) for a in sans]
        b = (b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
             .add_extension(x509.ExtendedKeyUsage([{"server": ExtendedKeyUsageOID.SERVER_AUTH,
                                                    "client": ExtendedKeyUsageOID.CLIENT_AUTH}[u] for u in usage]),
                            critical=False))
    return b.sign(issuer_key or key, hashes.SHA256())


def _sans(cert_pem: str) -> list[str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return sorted([str(v) for v in alt.get_values_for_type(x509.IPAddress)] + alt.get_values_for_type(x509.DNSName))


def ensure_cluster_tls(cluster: str, names: list[str]) -> dict[str, str]:
    """The cluster CA and an edge certificate naming exactly `names`, from the store (made when missing or when
    the names changed), under the store's lock. Returns the store."""
    data = store.ensure_secrets(cluster)  # creates the store's directory (0700) and file (0600)
    if CA_KEY in data and (not names or EDGE_CERT in data and _sans(data[EDGE_CERT]) == sorted(names)):
        return data  # (no names: no edge, only the CA, for m3_internal_tls)
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    path = store.secrets_path(cluster)
    with locked(path, f"the secrets store of {cluster}"):
        data = store.load_secrets(cluster)
        if CA_KEY not in data:
            ca_key = _key()
            data[CA_KEY] = _pem_key(ca_key)
            data[CA_CERT] = _pem_cert(_cert(f"m3deploy cluster CA {cluster}", ca_key, None, None, 3650, True))
            data.pop(EDGE_CERT, None)
        if names and (EDGE_CERT not in data or _sans(data[EDGE_CERT]) != sorted(names)):
            ca_key = serialization.load_pem_private_key(data[CA_KEY].encode(), password=None)
            ca_name = x509.load_pem_x509_certificate(data[CA_CERT].encode()).subject
            key = _key()
            data[EDGE_KEY] = _pem_key(key)
            data[EDGE_CERT] = _pem_cert(_cert(f"m3deploy edge {cluster}", key, ca_name, ca_key, 730, False,
                                              sorted(names)))
        store.write_secrets(cluster, data)
    return data


def _read_private(path: str, key: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise M3Error(f"key {key}: {p} does not exist on the controller (or is not a file). Fix: point {key} at the "
                      "PEM file, or remove m3_tls_cert_file and m3_tls_key_file to use the cluster CA")
    store.require_private(p, f"key {key}: {p}")
    text = p.read_text()
    if "-----BEGIN" not in text:
        raise M3Error(f"key {key}: {p} is not PEM (no -----BEGIN line). Fix: convert it with openssl")
    return text


def edge_pem(plan) -> str:
    """What the edge's EDGE_PEM holds: certificate chain, then private key."""
    st = _settings(plan)
    if st.get("m3_tls_cert_file"):
        cert = _read_private(st["m3_tls_cert_file"], "m3_tls_cert_file")
        key = _read_private(st["m3_tls_key_file"], "m3_tls_key_file")
        return cert.rstrip("\n") + "\n" + key.rstrip("\n") + "\n"
    data = ensure_cluster_tls(plan.name, edge_names(plan))
    return data[EDGE_CERT] + data[EDGE_KEY]


def ca_path(plan) -> str | None:
    """Where ca_file puts (or finds) the CA our clients trust, without making anything: for reproduce lines."""
    st = _settings(plan)
    if not plan.endpoint.startswith("https://"):
        return None
    if st.get("m3_tls_cert_file"):
        return str(Path(st["m3_tls_ca_file"]).expanduser()) if st.get("m3_tls_ca_file") else None
    return str(store.secrets_path(plan.name).with_name("ca.pem"))


def ca_file(plan) -> str | None:
    """The CA file our clients verify the edge with: m3_tls_ca_file, the cluster CA's certificate
    (`<config>/<cluster>/ca.pem`, written from the store), or None (the system's trust store)."""
    path = ca_path(plan)
    if path is None or _settings(plan).get("m3_tls_cert_file"):
        return path
    data = ensure_cluster_tls(plan.name, edge_names(plan))
    path = Path(path)
    if not path.is_file() or path.read_text() != data[CA_CERT]:
        tmp = path.with_name(f".ca.pem.{os.getpid()}.tmp")
        tmp.write_text(data[CA_CERT])
        os.replace(tmp, path)
    return str(path)


def client_context(plan):
    """An ssl.SSLContext that verifies the edge (ca_file, plus the system's store), or None for plain HTTP."""
    import ssl

    if not plan.endpoint.startswith("https://"):
        return None
    ctx = ssl.create_default_context()
    ca = ca_file(plan)
    if ca:
        ctx.load_verify_locations(cafile=ca)
    return ctx


def trust(plan):
    """Make every urllib request of this process verify the edge with ca_file (urllib's default opener gets an
    HTTPS handler with client_context); return that context (None for plain HTTP). The deploy (its serving
    check, the rollout), verify and bench call it once with the plan, before their first request."""
    import urllib.request

    ctx = client_context(plan)
    if ctx is not None:
        urllib.request.install_opener(urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx)))
    return ctx


# ------------------------------------------------------------------------- inside the cluster (m3_internal_tls)
def _wanted(plan) -> dict[str, tuple[str, str]]:
    """{`host:who`: (the host's address, who)} for every certificate the plan's TLS files name
    (m3deploy.core.internal_tls: `etcd` and `nats` serve and are clients of their peers, `client` only connects)."""
    addr = {h.name: h.address for h in plan.hosts}
    out = {}
    for h in plan.hosts:
        for s in h.services:
            for _, ref in s.secret_files:
                if ref.startswith("tls-cert:"):
                    host, who = ref.removeprefix("tls-cert:").rsplit(":", 1)
                    out[f"{host}:{who}"] = (addr[host], who)
    return out


def _current(data: dict, name: str, address: str) -> bool:
    from cryptography import x509

    cert = data.get(f"tls-cert:{name}")
    if not cert or f"tls-key:{name}" not in data:
        return False
    want_cn = internal_tls.common_name(name.rsplit(":", 1)[1])
    if x509.load_pem_x509_certificate(cert.encode()).subject.rfc4514_string() != (f"CN={want_cn}" if want_cn else ""):
        return False  # made with another subject (etcd's gateway refuses a CommonName; Dynamo logs in by one)
    issuer = x509.load_pem_x509_certificate(cert.encode()).issuer
    return _sans(cert) == [address] and issuer == x509.load_pem_x509_certificate(data[CA_CERT].encode()).subject


def cluster_certs(plan) -> dict[str, str]:
    """The cluster CA's certificate and each planned certificate and key of m3_internal_tls, from the store (signed
    when missing, or when its host's address changed), under the store's lock: {secret ref: PEM}."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    want = _wanted(plan)
    if not want:
        return {}
    data = ensure_cluster_tls(plan.name, edge_names(plan))
    if not all(_current(data, n, a) for n, (a, _) in want.items()):
        with locked(store.secrets_path(plan.name), f"the secrets store of {plan.name}"):
            data = store.load_secrets(plan.name)
            ca_key = serialization.load_pem_private_key(data[CA_KEY].encode(), password=None)
            ca_name = x509.load_pem_x509_certificate(data[CA_CERT].encode()).subject
            for name, (address, who) in want.items():
                if not _current(data, name, address):
                    key = _key()
                    usage = ("server", "client") if who in ("etcd", "nats", "peer") else ("client",)
                    data[f"tls-key:{name}"] = _pem_key(key)
                    # the subject: the etcd user of a Dynamo client, else none (the address is in the SAN; etcd
                    # 3.4's JSON gateway refuses a CommonName: m3deploy.core.internal_tls.COMMON_NAME says why)
                    data[f"tls-cert:{name}"] = _pem_cert(_cert(internal_tls.common_name(who), key, ca_name, ca_key,
                                                               730, False, [address], usage))
            store.write_secrets(plan.name, data)
    return {CA_REF: data[CA_CERT], **{k: data[k] for n in want for k in (f"tls-cert:{n}", f"tls-key:{n}")}}
