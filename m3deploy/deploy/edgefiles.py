"""The edge's host files (m3deploy.core.edge), as pure text: part of m3deploy.deploy.hostfiles.host_files.

- /etc/m3/haproxy.cfg (0644: no secret; it names the two files below),
- /etc/m3/edge.pem (0600 root: certificate chain + key; m3deploy.controller.tls),
- /etc/m3/edge-api-keys.sha256 (0600 root, with m3_api_key_file: the SHA-256 of each key, no key),
- /etc/systemd/system/m3-edge.service (haproxy -Ws; reload = hitless),
- the package's haproxy.service masked (a link to /dev/null, first: its postinst would start Debian's config).
HAProxy's master reads them as root at start and at every reload, before its workers drop to user haproxy.
"""
from __future__ import annotations

import urllib.parse

from m3deploy.core import catalog, components, edge
from m3deploy.core.inputs import url_host
from m3deploy.core.model import ClusterPlan, Service
from m3deploy.deploy.hostfile import HostFile, package_mask, unit_path
from m3deploy.deploy.render import render

CONNECT_MS = 1000  # a refused connection is retried after this (HAProxy waits min(timeout connect, 1 s))
RETRIES = 3  # with redispatch: another frontend on each retry
CHECK_MS = 1000  # health check interval; a frontend is out after 2 failed checks, back after 1


def _secret(secrets, name: str) -> str:
    return f"<secret: {name}>\n" if secrets is None else secrets[name]


def servers(cp: ClusterPlan) -> list[dict]:
    return [{"name": edge.server_name(s), "address": p.address, "port": p.port}
            for h in cp.hosts for s in h.services if s.kind == "frontend" for p in s.ports if p.name == "http"]


def keys_required(cp: ClusterPlan) -> bool:
    return bool(dict(cp.settings).get("m3_api_key_file"))


def binds(s: Service) -> list[str]:
    """HAProxy `bind` addresses: the host's, and the cluster's (m3_vip) with `transparent` (IP_TRANSPARENT: bound
    while another control host holds the address, so the edge answers the moment keepalived moves it here; HAProxy
    2.6, Debian 12's, has no `freebind`; the master binds as root, which has CAP_NET_ADMIN)."""
    return [f"{url_host(p.address)}:{p.port}" + (" transparent" if p.name == edge.VIP_PORT else "") for p in s.ports]


def ready_uri(model: str) -> str:
    """The frontend's readiness route of `model` (Dynamo 1.6.1: `{"model": ..., "ready": true, ...}` once it can
    route it; check.readiness.model_ready asks the same), the edge's health check."""
    return f"/v1/models/{urllib.parse.quote(model, safe='')}/ready"


def config(cp: ClusterPlan, s: Service) -> HostFile:
    st = dict(cp.settings)
    text = render("haproxy.cfg.j2", cluster=cp.name, socket=edge.EDGE_SOCKET, pem=edge.EDGE_PEM,
                  keys=edge.EDGE_KEYS, keys_required=keys_required(cp), frontend=edge.FRONTEND, binds=binds(s),
                  backend=edge.BACKEND, servers=servers(cp), connect_ms=CONNECT_MS, retries=RETRIES,
                  check_ms=CHECK_MS, model=cp.served_model_name, ready_uri=ready_uri(cp.served_model_name),
                  tls=catalog.tls_profile(), timeout_s=int(st["m3_edge_timeout_server_s"]),
                  bufsize=int(st["m3_edge_retry_body_kb"]) * 1024)
    return HostFile(edge.EDGE_CONF, text)


def unit(cp: ClusterPlan, s: Service) -> HostFile:
    check = ("/usr/sbin/haproxy", "-f", edge.EDGE_CONF, "-c", "-q")
    text = render(components.get("edge").template, cluster=cp.name, service=s, check=check,
                  rundir=edge.EDGE_RUN.removeprefix("/run/"))
    return HostFile(unit_path(s), text)


def edge_files(cp: ClusterPlan, s: Service, secrets) -> list[HostFile]:
    """In deploy order: the mask, the secrets (the config names them), the config, the unit."""
    out = [package_mask("edge"), HostFile(edge.EDGE_PEM, _secret(secrets, edge.TLS_SECRET), mode="0600", secret=True)]
    if keys_required(cp):
        out.append(HostFile(edge.EDGE_KEYS, _secret(secrets, edge.KEYS_SECRET), mode="0600", secret=True))
    return out + [config(cp, s), unit(cp, s)]
