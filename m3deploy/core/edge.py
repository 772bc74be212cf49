"""The edge: HAProxy (Debian's `haproxy`) on each control host in front of the Dynamo frontends (m3_edge).

Pure plan data, no I/O. With m3_edge the plan gives each control host
- `m3_edge_frontends` frontend processes (`m3-frontend`, `m3-frontend-1`, ...: consecutive ports from
  m3_frontend_port, each its own HOME and env file), so that a planned restart of one is drained at the edge while
  another serves (a single frontend restart failed 54-64 requests under load: issue 25);
- one `m3-edge` service: `haproxy -Ws` (master-worker: a reload is hitless) with /etc/m3/haproxy.cfg, listening
  with TLS on the host's cluster address and m3_edge_port, every frontend of the cluster as a backend (health
  check on each frontend's /health listing a `generate` instance and /v1/models/{model}/ready; retries and
  redispatch on a failed connection, a 404 or a 503, each request buffered whole first);
  its runtime API on a root-only unix socket (EDGE_SOCKET) for the drains (roles/edge.py).
The plan's endpoint becomes `https://<first control host>:<m3_edge_port>/v1`, or with m3_vip
`https://<m3_vip>:<m3_edge_port>/v1` (keepalived moves that address between the control hosts: m3deploy.core.vip;
the edge then also listens on it). This function is the one owner of the endpoint under the edge.

API keys (m3_api_key_file, one per line, every line valid) are checked by the edge: the file on the host
(EDGE_KEYS, 0600) holds only the SHA-256 of each key, never a key itself; a request without a matching
`Authorization: Bearer KEY` header (the scheme in any case) gets 401 from the edge and reaches no frontend. TLS
material (EDGE_PEM, 0600) comes from m3deploy.controller.tls.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from m3deploy.core import vip
from m3deploy.core.inputs import url_host
from m3deploy.core.model import Port, Readiness, Service
from m3deploy.core.provenance import launch_provenance, provenance

EDGE_UNIT = "m3-edge"
EDGE_CONF = "/etc/m3/haproxy.cfg"
EDGE_KEYS = "/etc/m3/edge-api-keys.sha256"  # one hex SHA-256 of each key per line: no key on the host
EDGE_PEM = "/etc/m3/edge.pem"  # certificate chain + private key, as HAProxy's `crt` wants them
EDGE_RUN = "/run/m3-edge"
EDGE_SOCKET = f"{EDGE_RUN}/admin.sock"  # the runtime API, root only (mode 600)
BACKEND = "frontends"
FRONTEND = "edge"  # haproxy.cfg's frontend section (the VIP's track script asks its status)
VIP_PORT = "vip"  # the edge's port on m3_vip (bound with `transparent`: held by one control host at a time)
TLS_SECRET = "edge-pem"  # the secrets_for() entry holding EDGE_PEM's text (never in the plan)
KEYS_SECRET = "edge-api-key-hashes"
SOURCE = "m3deploy/core/edge.py"  # the secrets_for() entry holding EDGE_KEYS's text


def enabled(s: Mapping[str, Any]) -> bool:
    return bool(s.get("m3_edge")) and s.get("m3_serving") == "dynamo"


def frontend_count(s: Mapping[str, Any]) -> int:
    """How many frontends each control host runs: m3_edge_frontends behind the edge, else one."""
    return int(s["m3_edge_frontends"]) if enabled(s) else 1


def server_name(s: Service) -> str:
    """The frontend's name in the edge's backend (HAProxy allows letters, digits, '-', '_', '.', ':')."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{s.host}/{s.name}").replace("/", ":")


def edge_service(host: str, address: str, port: int, fronts: list[Service], vip: str = "") -> Service:
    """The edge on `host`: HTTPS on its address, and on the cluster's address (m3_vip) when there is one."""
    argv = ("/usr/sbin/haproxy", "-Ws", "-f", EDGE_CONF, "-p", f"{EDGE_RUN}/haproxy.pid")
    return Service(
        name=EDGE_UNIT, kind="edge", host=host, argv=argv,
        provenance=launch_provenance(argv[:1], "feature:m3_edge", SOURCE) + provenance(argv, (), "feature:m3_edge",
                                                                                         SOURCE),
        ports=(Port("https", port, address, key="m3_edge_port"),)
        + ((Port(VIP_PORT, port, vip, key="m3_edge_port"),) if vip else ()),
        readiness=Readiness(kind="tcp", address=address, port=port, timeout_s=60),
        after=tuple(f"{f.host}/{f.name}" for f in fronts if f.host == host))


def endpoint(address: str, port: int) -> str:
    return f"https://{url_host(address)}:{port}/v1"


def add_services(services: dict[str, list[Service]], control: list[str], addr: Mapping[str, str],
          s: Mapping[str, Any]) -> str:
    """Add the edge (and keepalived, m3_vip) to each control host's services, in front of every frontend of the
    cluster (core.control built them, m3_edge_frontends per host); return the endpoint."""
    port = int(s["m3_edge_port"])
    fronts = [x for c in control for x in services[c] if x.kind == "frontend"]
    address = vip.address(s)
    for c in control:
        services[c].append(edge_service(c, addr[c], port, fronts, address))
    vip.add_services(services, control, s)  # keepalived on each control host, after its edge
    return endpoint(address or addr[control[0]], port)


def problems(s: Mapping[str, Any], n_control: int) -> list[str]:
    """The edge's own rules (validate.edge_settings)."""
    out = []
    if not s.get("m3_edge"):
        return out
    if s.get("m3_serving") != "dynamo" or not n_control:
        out.append("key m3_edge: the edge fronts Dynamo frontends on the control hosts. Fix: m3_serving = 'dynamo' "
                   "with a control group, or remove m3_edge")
    first, n, port = int(s["m3_frontend_port"]), int(s["m3_edge_frontends"]), int(s["m3_edge_port"])
    if first <= port < first + n:
        out.append(f"key m3_edge_port: {port} is one of the frontends' ports ({first}..{first + n - 1}: "
                   f"m3_frontend_port + m3_edge_frontends). Fix: choose another port, e.g. 8443")
    if first + n - 1 > 65535:
        out.append(f"key m3_edge_frontends: ports {first}..{first + n - 1} pass 65535. Fix: lower m3_frontend_port")
    if bool(s.get("m3_tls_cert_file")) != bool(s.get("m3_tls_key_file")):
        out.append("keys m3_tls_cert_file / m3_tls_key_file: set both (the edge's certificate chain and its key) or "
                   "neither (a certificate from the cluster CA). Fix: add the missing one")
    if s.get("m3_tls_ca_file") and not s.get("m3_tls_cert_file"):
        out.append("key m3_tls_ca_file: only with m3_tls_cert_file (with the cluster CA, clients trust that CA). "
                   "Fix: remove it, or set m3_tls_cert_file and m3_tls_key_file")
    return out


def key_hashes(keys: list[str]) -> str:
    """EDGE_KEYS's text: the hex SHA-256 (upper case, as HAProxy's `hex` converter writes it) of each key, one per
    line. HAProxy hashes the credentials after the scheme, so the scheme's case is free (RFC 9110 11.1)."""
    return "".join(hashlib.sha256(k.encode()).hexdigest().upper() + "\n" for k in keys)
