"""The user's own edge certificate (m3_tls_cert_file, m3_tls_key_file, m3_tls_ca_file), checked on the controller
before any host is touched: by `m3deploy validate` and by the deploy before it connects (issue 35).

HAProxy (Debian 12's 2.6) loads the chain and key from one PEM at start and at every reload: a key that does not
match the certificate fails its config check on every control host at once (a fresh deploy starts no edge; after a
rotation the next restart takes the endpoint down), and an expired certificate goes live on every edge at once. So
each is refused here, naming the key, the hosts that set it (and the file they set it in), the file and the fix:
- a path that is missing, a directory, unreadable, or not PEM; a key file (or a certificate file: the deploy
  reads both as secrets, controller/tls.py) that others can read;
- a key that is not the certificate's (the first certificate of the chain is the edge's);
- a certificate expired, not yet valid, or inside the renewal window (`m3_cert_renew_days`, default 30 days);
- with m3_tls_ca_file: a chain that does not lead to a CA of that file (each certificate signed by the next one
  of m3_tls_cert_file, the last by a certificate of the CA file, each checked by its signature).
Read with the `cryptography` package; nothing of a key is ever printed.
"""
from __future__ import annotations

import datetime
import os
import stat
from collections import defaultdict
from typing import Iterable

from m3deploy.core.connection import hosts_phrase
from m3deploy.core.settings import get

KEYS = ("m3_tls_cert_file", "m3_tls_key_file", "m3_tls_ca_file")
FIX_PAIR = ("Fix: point m3_tls_cert_file and m3_tls_key_file at the edge's certificate chain and its key (PEM, "
            "chmod 600), or remove both to have the cluster CA make one (docs/OPERATIONS.md \"The edge\")")


def problems(hosts: Iterable) -> list[str]:
    """Every problem of the user's edge TLS files named by these InvHosts (none without m3_tls_cert_file)."""
    hosts = list(hosts)
    value = {k: next((get(h.data, k) for h in hosts if h.data.get(k) is not None), None) for k in KEYS}
    if not value["m3_tls_cert_file"] or not value["m3_tls_key_file"]:
        return []  # one without the other: m3deploy.core.edge.problems says so
    where = {k: where_set(hosts, k) for k in KEYS}
    renew = int(next((get(h.data, "m3_cert_renew_days") for h in hosts
                      if h.data.get("m3_cert_renew_days") is not None), get({}, "m3_cert_renew_days")))
    return [f"{where[k]}: key {k}: {why}" for k, why in check(value, renew)]


def where_set(hosts: Iterable, key: str) -> str:
    """The hosts that set `key`, with the file(s) they set it in (also `m3deploy validate`'s for m3_api_key_file)."""
    by_src: dict[str, list[str]] = defaultdict(list)
    for h in hosts:
        if h.data.get(key) is not None:
            by_src[(getattr(h, "sources", {}) or {}).get(key, "")].append(h.name)
    names = [n for ns in by_src.values() for n in ns]
    files = ", ".join(s for s in by_src if s)
    return hosts_phrase(names) + (f" ({files})" if files else "")


def check(value: dict, renew_days: int, now: datetime.datetime | None = None) -> list[tuple[str, str]]:
    """[(key, what is wrong and the fix)] of the files in `value` ({key: path}), in the order a user fixes them."""
    out: list[tuple[str, str]] = []
    texts = {}
    for k in KEYS:
        if value.get(k):
            text, why = _read(k, value[k])
            if why:
                out.append((k, why))
            texts[k] = text
    if out:
        return out
    from cryptography import x509

    cert_path, key_path = value["m3_tls_cert_file"], value["m3_tls_key_file"]
    try:
        chain = x509.load_pem_x509_certificates(texts["m3_tls_cert_file"].encode())
    except ValueError:
        return [("m3_tls_cert_file", f"{cert_path} holds no PEM certificate HAProxy could load. {FIX_PAIR}")]
    key, why = _private_key(key_path, texts["m3_tls_key_file"])
    if why:
        return [("m3_tls_key_file", why)]
    leaf = chain[0]
    if _public(leaf.public_key()) != _public(key.public_key()):
        out.append(("m3_tls_key_file", f"{key_path} is not the private key of the certificate in {cert_path} "
                    f"(subject {leaf.subject.rfc4514_string() or 'empty'}): HAProxy would refuse the pair on every "
                    f"control host. {FIX_PAIR}"))
    out += _dates(leaf, cert_path, renew_days, now or datetime.datetime.now(datetime.timezone.utc))
    if value.get("m3_tls_ca_file"):
        out += _chain(chain, value["m3_tls_ca_file"], texts["m3_tls_ca_file"], cert_path)
    return out


def _read(key: str, path: str) -> tuple[str, str]:
    """(the file's text, '') or ('', why it cannot be used)."""
    p = os.path.expanduser(str(path))
    if os.path.isdir(p):
        return "", f"{path} is a directory, not a file. Fix: name the PEM file in it"
    if not os.path.isfile(p):
        return "", f"{path} does not exist on this controller. {FIX_PAIR if key != 'm3_tls_ca_file' else FIX_CA}"
    mode = stat.S_IMODE(os.stat(p).st_mode)
    if key != "m3_tls_ca_file" and mode & 0o077:
        what = "a private key" if key == "m3_tls_key_file" else "read as a secret by the deploy"
        return "", f"{path} can be read by others (mode {mode:o}; {what}). Fix: chmod 600 {path}"
    try:
        with open(p, encoding="ascii") as f:
            text = f.read()
    except (OSError, UnicodeError) as e:
        return "", (f"{path} cannot be read as PEM text ({type(e).__name__}). Fix: run as its owner, or convert "
                    "it to PEM with openssl")
    if "-----BEGIN" not in text:
        return "", (f"{path} is not PEM (no -----BEGIN line). Fix: convert it, e.g. openssl x509 -inform der -in "
                    f"FILE -out {path}")
    return text, ""


FIX_CA = "Fix: point m3_tls_ca_file at the PEM of the CA that signed the chain, or remove it (the system's store)"


def _private_key(path: str, text: str):
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(text.encode(), password=None), ""
    except TypeError:
        return None, (f"{path} is encrypted: HAProxy starts unattended and cannot ask for its passphrase. Fix: "
                      f"openssl pkey -in {path} -out {path}.plain, then chmod 600 and point m3_tls_key_file at it")
    except Exception:  # noqa: BLE001 - cryptography raises ValueError, UnsupportedAlgorithm, ... for a bad key
        return None, f"{path} holds no PEM private key HAProxy could load. {FIX_PAIR}"


def _public(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _dates(cert, path: str, renew_days: int, now: datetime.datetime) -> list[tuple[str, str]]:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    fix = ("Fix: a certificate valid for longer (renew it with your CA and point m3_tls_cert_file and "
           "m3_tls_key_file at the new pair), or remove both to use the cluster CA's")
    if end <= now:
        return [("m3_tls_cert_file", f"{path} expired on {end:%Y-%m-%d %H:%M} UTC: every edge would serve it and "
                 f"every client refuse it. {fix}")]
    if start > now:
        return [("m3_tls_cert_file", f"{path} is not valid before {start:%Y-%m-%d %H:%M} UTC (clients refuse it "
                 f"until then). {fix}")]
    left = (end - now).days
    if end - now < datetime.timedelta(days=renew_days):
        return [("m3_tls_cert_file", f"{path} expires on {end:%Y-%m-%d} ({left} days left), inside the renewal "
                 f"window (m3_cert_renew_days = {renew_days}). {fix}, or lower m3_cert_renew_days")]
    return []


def _chain(chain: list, ca_path: str, ca_text: str, cert_path: str) -> list[tuple[str, str]]:
    """The chain leads to a CA of ca_path: each certificate signed by the next, the last by a CA certificate."""
    from cryptography import x509

    try:
        cas = x509.load_pem_x509_certificates(ca_text.encode())
    except ValueError:
        return [("m3_tls_ca_file", f"{ca_path} holds no PEM certificate. {FIX_CA}")]
    for cert, issuer in zip(chain, chain[1:]):
        if not _signed_by(cert, issuer):
            return [("m3_tls_cert_file", f"{cert_path}: the certificate {cert.subject.rfc4514_string() or '(empty)'}"
                     f" is not signed by the next one in the file ({issuer.subject.rfc4514_string()}). Fix: the "
                     "file holds the edge's certificate first, then each issuer in order")]
    last = chain[-1]
    if any(_signed_by(last, ca) or _public(last.public_key()) == _public(ca.public_key()) for ca in cas):
        return []
    return [("m3_tls_ca_file", f"{ca_path} holds no CA that signed {cert_path} (its last certificate's issuer is "
             f"{last.issuer.rfc4514_string() or 'empty'}), so every client of ours would refuse the edge. "
             f"{FIX_CA}, or add the missing intermediate to m3_tls_cert_file")]


def _signed_by(cert, issuer) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except Exception:  # noqa: BLE001 - a wrong issuer name, signature or key type: not signed by it
        return False
