"""TLS for the edge (m3deploy.core.edge): the user's certificate, or one from the cluster CA the controller keeps.

With m3_tls_cert_file + m3_tls_key_file (controller paths, both 0600) the edge serves that chain; our clients
trust m3_tls_ca_file, else the system's store. Without them the controller makes, once, a cluster CA (EC P-256,
`m3_ca_validity_days`, 10 years) and an edge certificate signed by it (`m3_cert_validity_days`, 2 years) naming
every control host's address and m3_vip's; the CA's key, the edge key and both certificates are kept in the secrets
store (m3deploy.controller.secrets, 0600). The edge certificate is made again when the addresses it must name or its
CA change, so a re-run changes nothing; m3deploy.controller.certs renews what is inside `m3_cert_renew_days` and
rotates the CA (the deploy, before any host).
The trust bundle (the CA's certificate, with the next or the previous CA while one is rotated) is also written to
`<config>/<cluster>/ca.pem`: what clients load (`ca_file`), and what every internal TLS file `-ca.crt` holds.

Every certificate is strict X.509 (RFC 5280; `openssl verify -x509_strict`, Python 3.13's default context):
Subject and Authority Key Identifiers, basicConstraints (critical), keyUsage (critical: keyCertSign and cRLSign
for the CA, digitalSignature for a leaf: EC keys sign, they do not encipher), extendedKeyUsage by role (`ROLES`), a
subject or, where a leaf has none (etcd's gateway refuses a CommonName), a critical subjectAltName.

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
from m3deploy.core import internal_tls, settings
from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import is_ip

CA_KEY, CA_CERT, EDGE_KEY, EDGE_CERT = "cluster-ca-key", "cluster-ca-cert", "edge-tls-key", "edge-tls-cert"
# a CA rotation (m3deploy.controller.certs): the next CA, trusted before it signs; the previous one, trusted
# until no certificate the hosts hold is its
NEXT_KEY, NEXT_CERT, PREV_CERT = "cluster-ca-next-key", "cluster-ca-next-cert", "cluster-ca-previous-cert"
CA_REF = CA_CERT  # m3deploy.core.internal_tls.CA_REF: the TLS files' name of the trust bundle
# extendedKeyUsage by role: the edge serves; etcd and NATS serve and are clients of their peers; the rest connect
ROLES = {"server": ("server",), "peer": ("server", "client"), "client": ("client",)}


def role(who: str) -> str:
    """An internal identity's role (m3deploy.core.internal_tls: `etcd`, `nats`, `peer`, `client`, `gateway`): the
    servers and etcd's peer leaf (it dials and answers on the peer port) get server and client use."""
    return "peer" if who in ("etcd", "nats", "peer") else "client"


def _settings(plan) -> dict:
    return dict(plan.settings)


def days(plan, key: str) -> int:
    """A lifecycle setting of the plan (m3_cert_renew_days, m3_cert_validity_days, m3_ca_validity_days)."""
    return int(settings.get(_settings(plan), key))


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


def load_cert(pem: str):
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.encode())


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _cert(subject: str, key, days: int, issuer=None, sans=(), usage: str = ""):
    """A certificate for `key`: a self-signed CA (`issuer` None, `usage` "") or a leaf of role `usage` signed by
    `issuer` = (CA certificate, CA key), never outliving it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = now_utc()
    ca = issuer is None
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)] if subject else [])
    issuer_cert, issuer_key = issuer or (None, key)
    not_after = now + datetime.timedelta(days=days)
    if issuer_cert is not None:
        not_after = min(not_after, issuer_cert.not_valid_after_utc)
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_cert.subject if issuer_cert else name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after)
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca, content_commitment=False,
                                      key_encipherment=False, data_encipherment=False, key_agreement=False,
                                      encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False))
    if not ca:
        alt = [x509.IPAddress(ipaddress.ip_address(a)) if is_ip(a) else x509.DNSName(a) for a in sans]
        eku = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}
        b = (b.add_extension(x509.SubjectAlternativeName(alt), critical=not subject)  # RFC 5280 4.2.1.6
             .add_extension(x509.ExtendedKeyUsage([eku[u] for u in ROLES[usage]]), critical=False))
    return b.sign(issuer_key, hashes.SHA256())


def strict_problems(cert) -> list[str]:
    """What RFC 5280 / `openssl verify -x509_strict` miss in `cert` (a cryptography certificate): [] when strict."""
    from cryptography import x509

    ext = {e.oid: e for e in cert.extensions}
    out = [f"no {n}" for n, c in (("Subject Key Identifier", x509.SubjectKeyIdentifier),
                                  ("Authority Key Identifier", x509.AuthorityKeyIdentifier))
           if c.oid not in ext]
    for n, c in (("basicConstraints", x509.BasicConstraints), ("keyUsage", x509.KeyUsage)):
        if c.oid not in ext or not ext[c.oid].critical:
            out.append(f"{n} missing or not critical")
    if not list(cert.subject):
        san = ext.get(x509.SubjectAlternativeName.oid)
        if san is None or not san.critical:
            out.append("an empty subject without a critical subjectAltName")
    return out


def new_ca(cluster: str, validity: int) -> tuple[str, str]:
    """(key PEM, certificate PEM) of a new cluster CA. Its subject names the moment it was made, so that two CAs
    trusted together during a rotation never share a name."""
    key = _key()
    cert = _cert(f"m3deploy cluster CA {cluster} {now_utc():%Y-%m-%d %H:%M:%S}", key, validity)
    return _pem_key(key), _pem_cert(cert)


def bundle(data: dict) -> str:
    """The trust bundle: the CA's certificate, with the next or the previous one during a rotation, oldest
    first (so the bundle's text is the same before and after the next CA takes over)."""
    certs = [load_cert(data[k]) for k in (CA_CERT, NEXT_CERT, PREV_CERT) if k in data]
    return "".join(_pem_cert(c) for c in sorted(certs, key=lambda c: (c.not_valid_before_utc, c.serial_number)))


def _sans(cert_pem: str) -> list[str]:
    from cryptography import x509

    cert = load_cert(cert_pem)
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return sorted([str(v) for v in alt.get_values_for_type(x509.IPAddress)] + alt.get_values_for_type(x509.DNSName))


def by_ca(data: dict, ref: str) -> bool:
    """Is the certificate `ref` of the store signed by its current CA?"""
    return load_cert(data[ref]).issuer == load_cert(data[CA_CERT]).subject


def _signer(data: dict):
    from cryptography.hazmat.primitives import serialization

    return load_cert(data[CA_CERT]), serialization.load_pem_private_key(data[CA_KEY].encode(), password=None)


def _edge_current(data: dict, names: list[str]) -> bool:
    return EDGE_CERT in data and EDGE_KEY in data and _sans(data[EDGE_CERT]) == sorted(names) and by_ca(data,
                                                                                                        EDGE_CERT)


def ensure_cluster_tls(plan) -> dict[str, str]:
    """The cluster CA and an edge certificate naming exactly the edge's addresses, from the store (made when
    missing, when the names changed or when its CA did), under the store's lock. Returns the store."""
    names = edge_names(plan)
    cluster = plan.name
    data = store.ensure_secrets(cluster)  # creates the store's directory (0700) and file (0600)
    if CA_KEY in data and (not names or _edge_current(data, names)):
        return data  # (no names: no edge, only the CA, for m3_internal_tls)
    path = store.secrets_path(cluster)
    with locked(path, f"the secrets store of {cluster}"):
        data = store.load_secrets(cluster)
        if CA_KEY not in data:
            data[CA_KEY], data[CA_CERT] = new_ca(cluster, days(plan, "m3_ca_validity_days"))
            data.pop(EDGE_CERT, None)
        if names and not _edge_current(data, names):
            key = _key()
            data[EDGE_KEY] = _pem_key(key)
            data[EDGE_CERT] = _pem_cert(_cert(f"m3deploy edge {cluster}", key, days(plan, "m3_cert_validity_days"),
                                              _signer(data), sorted(names), "server"))
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
    data = ensure_cluster_tls(plan)
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
    text = bundle(ensure_cluster_tls(plan))
    path = Path(path)
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f".ca.pem.{os.getpid()}.tmp")
        tmp.write_text(text)
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
def wanted(plan) -> dict[str, tuple[str, str]]:
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
    cert = data.get(f"tls-cert:{name}")
    if not cert or f"tls-key:{name}" not in data:
        return False
    want_cn = internal_tls.common_name(name.rsplit(":", 1)[1])
    if load_cert(cert).subject.rfc4514_string() != (f"CN={want_cn}" if want_cn else ""):
        return False  # made with another subject (etcd's gateway refuses a CommonName; Dynamo logs in by one)
    return _sans(cert) == [address] and by_ca(data, f"tls-cert:{name}")


def cluster_certs(plan) -> dict[str, str]:
    """The trust bundle and each planned certificate and key of m3_internal_tls, from the store (signed when
    missing, when its host's address changed or when its CA did), under the store's lock: {secret ref: PEM}."""
    want = wanted(plan)
    if not want:
        return {}
    data = ensure_cluster_tls(plan)
    if not all(_current(data, n, a) for n, (a, _) in want.items()):
        with locked(store.secrets_path(plan.name), f"the secrets store of {plan.name}"):
            data = store.load_secrets(plan.name)
            signer, validity = _signer(data), days(plan, "m3_cert_validity_days")
            for name, (address, who) in want.items():
                if not _current(data, name, address):
                    key = _key()
                    data[f"tls-key:{name}"] = _pem_key(key)
                    # the subject: the etcd user of a Dynamo client, else none (the address is in the SAN; etcd
                    # 3.4's JSON gateway refuses a CommonName: m3deploy.core.internal_tls.COMMON_NAME says why)
                    data[f"tls-cert:{name}"] = _pem_cert(_cert(internal_tls.common_name(who), key, validity, signer,
                                                               [address], role(who)))
            store.write_secrets(plan.name, data)
    return {CA_REF: bundle(data), **{k: data[k] for n in want for k in (f"tls-cert:{n}", f"tls-key:{n}")}}
