"""verify's checks of TLS inside the cluster (m3_internal_tls, m3deploy.core.internal_tls), from the controller:

- tls/etcd/<host>: etcd's client port refuses a client without a certificate (the TLS handshake fails or the
  connection closes before any answer), and answers /health over TLS to one with a certificate of the cluster CA,
  verifying etcd's certificate with that CA;
- tls/nats/<host>: NATS's INFO says tls_required and tls_verify, and a client without a certificate is refused;
  one with a certificate of the CA completes the handshake (verifying NATS's certificate with the CA).
The client certificate the checks show is a `client` one of the plan (the controller's store), written for the
moment of the check into a 0700 temporary directory and removed after it. The files' modes are file/... checks.
"""
from __future__ import annotations

import json
import os
import socket
import ssl
import tempfile
from collections.abc import Callable
from contextlib import contextmanager

from m3deploy.check.checks import Check, CheckFailed, Context
from m3deploy.controller import tls
from m3deploy.core import internal_tls
from m3deploy.core.model import ClusterPlan, HostPlan, Service


@contextmanager
def _contexts(plan: ClusterPlan):
    """(anonymous, with a client certificate): two SSL contexts that verify the servers with the cluster CA."""
    certs = tls.cluster_certs(plan)
    name = next(r for h in plan.hosts for s in h.services for _, r in s.secret_files if r.endswith(":client")
                and r.startswith("tls-cert:")).removeprefix("tls-cert:")
    with tempfile.TemporaryDirectory(prefix="m3-verify-tls-") as d:  # 0700
        ca, crt, key = (os.path.join(d, n) for n in ("ca.pem", "client.pem", "client.key"))
        for path, text in ((ca, certs[internal_tls.CA_REF]), (crt, certs[f"tls-cert:{name}"]),
                           (key, certs[f"tls-key:{name}"])):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        anon = ssl.create_default_context(cafile=ca)
        client = ssl.create_default_context(cafile=ca)
        client.load_cert_chain(crt, key)
        yield anon, client


def _exchange(address: str, port: int, ctx: ssl.SSLContext, send: bytes, preamble: bool = False) -> bytes:
    """Connect (reading NATS's plain INFO line first when `preamble`), TLS with `ctx`, send, read the answer."""
    with socket.create_connection((address, port), timeout=10) as raw:
        if preamble:
            raw.recv(4096)
        with ctx.wrap_socket(raw, server_hostname=address) as s:
            s.sendall(send)
            s.settimeout(10)
            return s.recv(4096)


def _refused(address: str, port: int, ctx: ssl.SSLContext, send: bytes, preamble: bool = False) -> str:
    try:
        got = _exchange(address, port, ctx, send, preamble)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
        return f"refused without a certificate ({type(e).__name__}: {str(e)[:80]})"
    if got:
        raise CheckFailed(f"{address}:{port} answered a client without a certificate: {got[:120]!r}")
    return "refused without a certificate (closed before any answer)"


def _etcd(s: Service) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        p = s.port("client")
        req = f"GET /health HTTP/1.1\r\nHost: {p.address}\r\nConnection: close\r\n\r\n".encode()
        with _contexts(ctx.plan) as (anon, client):
            no = _refused(p.address, p.port, anon, req)
            try:
                got = _exchange(p.address, p.port, client, req)
            except OSError as e:
                raise CheckFailed(f"{p.address}:{p.port} with a certificate of the cluster CA: {e}") from None
        if b" 200 " not in got.split(b"\r\n", 1)[0]:
            raise CheckFailed(f"{p.address}:{p.port} with a certificate: {got[:120]!r}")
        return f"{p.address}:{p.port}: {no}; /health 200 over TLS with one of the cluster CA"
    return fn


def _nats(s: Service) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        p = s.port("client")
        with socket.create_connection((p.address, p.port), timeout=10) as raw:
            line = raw.recv(4096).decode(errors="replace")
        info = json.loads(line.split(" ", 1)[1]) if line.startswith("INFO ") else {}
        if not (info.get("tls_required") and info.get("tls_verify")):
            raise CheckFailed(f"{p.address}:{p.port} INFO without tls_required and tls_verify: {line[:160]!r}")
        with _contexts(ctx.plan) as (anon, client):
            no = _refused(p.address, p.port, anon, b"PING\r\n", preamble=True)
            try:
                got = _exchange(p.address, p.port, client, b"CONNECT {\"verbose\":false}\r\nPING\r\n", preamble=True)
            except OSError as e:
                raise CheckFailed(f"{p.address}:{p.port} with a certificate of the cluster CA: {e}") from None
        if not got.startswith((b"PONG", b"-ERR 'Authorization")):
            raise CheckFailed(f"{p.address}:{p.port} with a certificate: {got[:120]!r}")
        return f"{p.address}:{p.port}: tls_required, tls_verify; {no}; TLS with one of the cluster CA: {got[:20]!r}"
    return fn


def _enabled(plan: ClusterPlan) -> bool:
    return any(internal_tls.is_tls_ref(r) for h in plan.hosts for s in h.services for _, r in s.secret_files)


def tls_checks(plan: ClusterPlan, only_host: str | None = None) -> list[Check]:
    if not _enabled(plan):
        return []
    out = []
    for h in plan.hosts:
        if only_host and h.name != only_host:
            continue
        out += _host_checks(h)
    return out


def _host_checks(h: HostPlan) -> list[Check]:
    out = []
    for s in h.services:
        p = s.port("client")
        if s.kind == "etcd":
            out.append(Check(f"tls/etcd/{h.name}", "health", h.name, "etcd refuses a client without a certificate of "
                             "the cluster CA, serves one with it", _etcd(s),
                             f"curl -sS --cacert CA https://{p.address}:{p.port}/health   # refused: no certificate"))
        elif s.kind == "nats":
            out.append(Check(f"tls/nats/{h.name}", "health", h.name, "NATS refuses a client without a certificate of "
                             "the cluster CA, serves one with it", _nats(s),
                             f"timeout 2 cat < /dev/tcp/{p.address}/{p.port}   # INFO ... tls_required, tls_verify"))
    return out
