"""verify's checks of the edge (m3_edge, m3deploy.core.edge), from the plan:

- edge/tls: the endpoint speaks TLS with a certificate our clients verify with the cluster's CA (m3deploy.controller
  .tls.client_context) and, with the cluster CA, one the system's trust store alone does not accept;
- edge/plain-http: the edge's port answers no plain-HTTP request;
- edge/backends/<host>: every frontend of the cluster is UP in that host's edge (its runtime API, over SSH);
- edge/files/<host>: the certificate+key and the keys' hashes are 0600 root:root, and no API key is in any file
  of the edge (the config, the hashes) nor in its journal.
- vip/holder (m3_vip): exactly one control host holds the cluster's address; the checks above and smoke/* go to
  the endpoint, which is that address: it answers HTTPS with the CA, 401 without a key, 200 with one.
The keys themselves (401 without one and with a wrong one, 200 with one) are smoke/api-key, through the edge.
"""
from __future__ import annotations

import shlex
import socket
import ssl
import urllib.parse
from collections.abc import Callable

from m3deploy.check.checks import Check, CheckFailed, Context, ssh_command
from m3deploy.controller import tls
from m3deploy.controller.secrets import api_keys
from m3deploy.core import edge, vip
from m3deploy.core.model import ClusterPlan, HostPlan
from m3deploy.facts.parse import parse_ip_addr

_CLI = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(sys.argv[2].encode()+b'\\n'); sys.stdout.write(s.makefile().read())")


def _hostport(plan: ClusterPlan) -> tuple[str, int]:
    u = urllib.parse.urlsplit(plan.endpoint)
    return u.hostname or "", u.port or 443


def _handshake(host: str, port: int, ctx: ssl.SSLContext) -> str:
    with socket.create_connection((host, port), timeout=10) as raw, ctx.wrap_socket(raw, server_hostname=host) as s:
        return f"{s.version()}, {s.cipher()[0]}"


def _tls(ctx: Context) -> str:
    host, port = _hostport(ctx.plan)
    verify = tls.client_context(ctx.plan)
    try:
        got = _handshake(host, port, verify)
    except (OSError, ssl.SSLError) as e:
        raise CheckFailed(f"TLS to {host}:{port} with {tls.ca_file(ctx.plan) or 'the system store'}: {e}") from None
    ev = f"{host}:{port}: {got}, verified with {tls.ca_file(ctx.plan) or 'the system trust store'}"
    if not dict(ctx.plan.settings).get("m3_tls_cert_file"):
        try:
            _handshake(host, port, ssl.create_default_context())
        except ssl.SSLCertVerificationError:
            return ev + "; refused by the system store alone (the cluster CA's certificate)"
        raise CheckFailed(ev + "; but the system store alone accepted it too (not the cluster CA's certificate?)")
    return ev


def _plain_http(ctx: Context) -> str:
    host, port = _hostport(ctx.plan)
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        s.settimeout(10)
        try:
            data = s.recv(4096)
        except (TimeoutError, ConnectionResetError):
            data = b""
    if b" 200 " in data.split(b"\r\n", 1)[0]:
        raise CheckFailed(f"{host}:{port} answered plain HTTP with 200: {data[:120]!r}")
    return f"{host}:{port}: no plain-HTTP answer ({data[:40]!r})" if data else f"{host}:{port}: closed, no answer"


def _backends(h: HostPlan) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        sock = shlex.quote(edge.EDGE_SOCKET)
        r = ctx.run(h.name, f"python3 -c {shlex.quote(_CLI)} {sock} 'show stat'")
        if r.rc != 0:
            out = (r.stderr or r.stdout)[:200]
            raise CheckFailed(f"the edge's runtime API on {h.name} ({edge.EDGE_SOCKET}): {out}")
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        head = lines[0].lstrip("# ").split(",") if lines else []
        rows = [dict(zip(head, ln.split(","))) for ln in lines[1:]]
        status = {x["svname"]: x.get("status", "?") for x in rows if x.get("pxname") == edge.BACKEND
                  and x.get("svname") not in ("BACKEND", "FRONTEND")}
        want = [edge.server_name(s) for x in ctx.plan.hosts for s in x.services if s.kind == "frontend"]
        bad = {n: status.get(n, "missing") for n in want if not status.get(n, "").startswith("UP")}
        if bad:
            raise CheckFailed(f"not UP in the edge on {h.name}: {bad}")
        return f"{len(want)} frontend(s) UP: {', '.join(want)}"
    return fn


def _files(h: HostPlan) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        paths = [edge.EDGE_PEM] + ([edge.EDGE_KEYS] if dict(ctx.plan.settings).get("m3_api_key_file") else [])
        r = ctx.run(h.name, "stat -c '%a %U:%G %n' " + " ".join(paths))
        modes = {}
        for ln in r.stdout.splitlines():
            parts = ln.split(" ", 2)
            if len(parts) == 3:
                modes[parts[2]] = f"{parts[0]} {parts[1]}"
        bad = {p: modes.get(p, "absent") for p in paths if modes.get(p) != "600 root:root"}
        if bad:
            raise CheckFailed(f"want 600 root:root: {bad}")
        keys = api_keys(ctx.plan)
        if keys:
            out = ctx.run(h.name, f"cat {edge.EDGE_CONF} {edge.EDGE_KEYS}; journalctl -u {edge.EDGE_UNIT} "
                                  "--no-pager -o cat -n 2000 2>/dev/null").stdout
            if any(k in out for k in keys):
                raise CheckFailed(f"an API key appears in {edge.EDGE_CONF}, {edge.EDGE_KEYS} or the edge's journal")
        return ", ".join(f"{p} {m}" for p, m in modes.items()) + (
            f"; none of the {len(keys)} key(s) in the edge's files or journal" if keys else "")
    return fn


def _vip_holder(ctx: Context) -> str:
    """m3_vip: exactly one control host has the address (each one's `ip -o -4 addr show`)."""
    address = vip.address(dict(ctx.plan.settings))
    held, asked = [], []
    for h in ctx.plan.hosts:
        if any(s.kind == "vip" for s in h.services):
            r = ctx.run(h.name, "ip -o -4 addr show")
            if r.rc != 0:
                raise CheckFailed(f"`ip -o -4 addr show` on {h.name} exited {r.rc}: {(r.stderr or r.stdout)[:200]}")
            asked.append(h.name)
            held += [h.name] if address in parse_ip_addr(r.stdout) else []
    if len(held) != 1:
        raise CheckFailed(f"{address} is held by {held or 'no control host'} of {asked} (exactly one must). Fix: "
                          f"`journalctl -u {vip.VIP_UNIT}` on the control hosts (FAULT: the edge is not serving)")
    return f"{address} held by {held[0]} (of {', '.join(asked)}); the endpoint's checks (edge/tls, smoke/*) use it"


def edge_checks(plan: ClusterPlan, inventory: dict | None = None, only_host: str | None = None) -> list[Check]:
    if not plan.endpoint.startswith("https://"):
        return []
    inv = inventory or {}
    host, port = _hostport(plan)
    out = [] if only_host else [
        Check("edge/tls", "smoke", "frontend", "the endpoint speaks TLS verified with the cluster's CA", _tls,
              f"curl -sS --cacert {shlex.quote(tls.ca_file(plan) or '')} {shlex.quote(plan.endpoint)}/models"),
        Check("edge/plain-http", "smoke", "frontend", "the edge answers no plain-HTTP request", _plain_http,
              f"curl -sS http://{host}:{port}/v1/models")]
    if vip.enabled(dict(plan.settings)) and not only_host:
        out.append(Check("vip/holder", "health", "frontend", "the cluster's address (m3_vip) is held by exactly one "
                         "control host", _vip_holder, "ip -o -4 addr show  # on each control host", ssh=True))
    for h in plan.hosts:
        if only_host and h.name != only_host or not any(s.kind == "edge" for s in h.services):
            continue
        out += [Check(f"edge/backends/{h.name}", "health", h.name, "every frontend is UP in the edge", _backends(h),
                      ssh_command(inv.get(h.name), f"echo 'show stat' | socat stdio {edge.EDGE_SOCKET}"), ssh=True),
                Check(f"edge/files/{h.name}", "file", h.name, "the edge's certificate and key hashes are 0600 root, "
                      "no key in its files or journal", _files(h),
                      ssh_command(inv.get(h.name), f"stat -c '%a %U:%G %n' {edge.EDGE_PEM} {edge.EDGE_KEYS}"),
                      ssh=True)]
    return out
