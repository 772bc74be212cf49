"""The control plane's services, each built once from the cluster's settings: etcd and NATS on every control host,
the Dynamo frontends, and what every Dynamo client shares (its env, its TLS parts). Pure: no I/O.

m3_internal_tls and m3_edge are inputs here, not passes over built services: with TLS each builder adds the
flags, env, files and launcher of m3deploy.core.internal_tls itself; with the edge the frontend builder is called
once per frontend index (m3_edge_frontends), each with its own port, HOME and env file. Every argv flag and env
value carries its provenance (`m3deploy plan --explain`): the recipe layer, or this module with the setting it
read.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from m3deploy.core import catalog, internal_tls, recipes
from m3deploy.core.inputs import url_host
from m3deploy.core.model import Port, Provenance, Readiness, Service
from m3deploy.core.provenance import launch_provenance, provenance

ETCD_CLIENT, ETCD_PEER, NATS_CLIENT, NATS_MONITOR, NATS_CLUSTER = 2379, 2380, 4222, 8222, 6222
# Passwords live in the controller's 0600 secrets store (m3deploy.controller.secrets); roles write them only into the
# services' 0600 env files. Dynamo 1.6.1 reads ETCD_AUTH_* / NATS_AUTH_* (docs/DYNAMO.md).
AUTH_USER = "m3"
DYN_SECRET_ENV = (("ETCD_AUTH_PASSWORD", "etcd-password"), ("NATS_AUTH_PASSWORD", "nats-password"))
SOURCE = "m3deploy/core/control.py"
TLS_LAYER, TLS_SOURCE = "feature:m3_internal_tls", "m3deploy/core/internal_tls.py"
# the Dynamo env a process's own cluster address fills (provenance: the host's m3_address)
ADDRESS_ENV = dict.fromkeys(("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST",
                             "DYN_SYSTEM_HOST"), "m3_address")


@dataclass(frozen=True)
class ClientInputs:
    """What every Dynamo client (frontend, worker, scripted engine, planner, actuator) is built from."""

    etcd: str  # ETCD_ENDPOINTS
    nats: str  # NATS_SERVER of a worker (the first control host's NATS)
    auth: bool  # m3_auth
    tls: bool  # m3_internal_tls
    lease_ttl: int | None  # m3_etcd_lease_ttl
    notes: Mapping[str, str]  # env name -> the setting it comes from (provenance)


def etcd_jwt_keys(workdir: str) -> tuple[str, str]:
    """etcd's JWT signing key pair (made on the host by roles/etcd.py, never leaves it)."""
    return f"{workdir}/jwt.key", f"{workdir}/jwt.pub"


def etcd_jwt_option(workdir: str) -> str:
    """Signed (JWT) auth tokens instead of etcd's default `simple` ones: simple tokens live in etcd's memory, so
    an etcd restart invalidates every client's token, and Dynamo 1.6.1 does not log in again (its frontend then
    lists no worker: "invalid auth token", issue 12). A JWT stays valid across restarts; its TTL is long because
    Dynamo does not renew it either (it is worth no more than the password its client holds)."""
    key, pub = etcd_jwt_keys(workdir)
    return f"jwt,pub-key={pub},priv-key={key},sign-method=RS256,ttl=87600h"


def nats_seed(a: str, tls: bool = False) -> str:
    """NATS_SERVER: ONE URL. Dynamo 1.6.1 passes it as a String to async-nats's connect(), whose
    `impl ToServerAddrs for str` parses a single ServerAddr (nats-io/nats.rs async-nats/src/lib.rs), so a list
    is refused. In a NATS cluster the client learns the other servers from the seed's INFO `connect_urls` and
    fails over to them; only a process (re)started while its seed is down waits for it (docs/OPERATIONS.md)."""
    return f"{internal_tls.client_scheme(tls)}://{url_host(a)}:{NATS_CLIENT}"


def etcd_urls(addresses: list[str], tls: bool) -> str:
    """ETCD_ENDPOINTS: one client URL per control host (https with m3_internal_tls)."""
    scheme = "https" if tls else "http"
    return ",".join(f"{scheme}://{url_host(a)}:{ETCD_CLIENT}" for a in addresses)


# ------------------------------------------------------------------------------------------- etcd and NATS

def control_services(host: str, a: str, state_dir: str, auth: bool, members: tuple[tuple[str, str], ...],
                     cluster: str, tls: bool = False) -> list[Service]:
    """etcd + NATS on one control host; `members`: (name, address) of every control host, this one included.
    Peer traffic (etcd 2380, NATS routes 6222) is plain TCP on the cluster addresses, like the client traffic:
    the cluster network is trusted (docs/OPERATIONS.md), or TLS with client certificates (m3_internal_tls). Only
    the first member turns etcd auth on (it is cluster-wide data; members running the script at once would race
    on `auth enable`)."""
    return [_etcd(host, a, state_dir, auth, members, cluster, tls), _nats(host, a, state_dir, auth, members, tls)]


def _etcd(host: str, a: str, state_dir: str, auth: bool, members: tuple[tuple[str, str], ...], cluster: str,
          tls: bool) -> Service:
    u, scheme = url_host(a), "https" if tls else "http"  # an IPv6 address in brackets (RFC 3986)
    first = members[0][0] == host
    cluster_flags: tuple[str, ...] = ()
    if len(members) > 1:  # a new cluster's identity; both are ignored once the data dir exists
        cluster_flags = ("--initial-cluster-state", "new", "--initial-cluster-token", f"m3-{cluster}")
    client, peer = f"{scheme}://{u}:{ETCD_CLIENT}", f"{scheme}://{u}:{ETCD_PEER}"
    argv = (("/usr/bin/etcd", "--name", host, "--data-dir", f"{state_dir}/etcd/data",
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", ",".join(f"{n}={scheme}://{url_host(m)}:{ETCD_PEER}" for n, m in members))
            + cluster_flags + (("--auth-token", etcd_jwt_option(f"{state_dir}/etcd")) if auth else ()))
    tls_argv = internal_tls.etcd_flags("etcd", a) if tls else ()
    env = (("M3_ETCD_URL", client), ("M3_ETCD_USER", AUTH_USER)) if auth and first else ()
    tls_env = internal_tls.etcd_login_env("etcd") if tls and env else ()
    health = f"http://{u}:{internal_tls.ETCD_METRICS}/health" if tls else f"http://{u}:{ETCD_CLIENT}/health"
    return Service(
        name="etcd", kind="etcd", host=host, argv=argv + tls_argv, env=env + tls_env,
        secret_env=(("M3_ETCD_ROOT_PASSWORD", "etcd-root-password"), ("M3_ETCD_PASSWORD", "etcd-password"))
        if auth and first else (),
        ports=(Port("client", ETCD_CLIENT, a), Port("peer", ETCD_PEER, a))
        + ((Port("metrics", internal_tls.ETCD_METRICS, a),) if tls else ()),
        readiness=Readiness(kind="http", url=health, expect_json=(("health", "true"),), timeout_s=60),
        env_file="/etc/m3/etcd.env", workdir=f"{state_dir}/etcd",
        secret_files=internal_tls.etcd_files("etcd", host) if tls else (), tls=tls,
        provenance=provenance(argv, env, "plan:etcd", SOURCE, {"--name": "the inventory's host name"})
        + provenance(tls_argv, tls_env, TLS_LAYER, TLS_SOURCE))


def _nats(host: str, a: str, state_dir: str, auth: bool, members: tuple[tuple[str, str], ...],
          tls: bool) -> Service:
    # NATS routes to the other nodes, as M3_NATS_ROUTE_<i> (nats.conf names the variables): nats-server 2.9 sends
    # no credentials on a route whose URL has none, so with auth the URL carries the route user's password and
    # lives in the 0600 env file (a secret_env value "{secret-name}" is filled from the secrets store)
    u = url_host(a)
    routes = [f"nats-route://{AUTH_USER + ':{nats-password}@' if auth else ''}{url_host(m)}:{NATS_CLUSTER}"
              for n, m in members if n != host]
    route_env = tuple((f"M3_NATS_ROUTE_{i}", r) for i, r in enumerate(routes))
    argv = ("/usr/sbin/nats-server", "-c", "/etc/m3/nats.conf")
    env = (("NATS_AUTH_USERNAME", AUTH_USER),) if auth else route_env
    return Service(
        name="nats", kind="nats", host=host, argv=argv, env=env,
        secret_env=(("NATS_AUTH_PASSWORD", "nats-password"),) + route_env if auth else (),
        ports=(Port("client", NATS_CLIENT, a), Port("monitor", NATS_MONITOR, a))
        + ((Port("cluster", NATS_CLUSTER, a),) if len(members) > 1 else ()),
        readiness=Readiness(kind="http", url=f"http://{u}:{NATS_MONITOR}/healthz?js-enabled-only=true", timeout_s=60),
        env_file="/etc/m3/nats.env", workdir=f"{state_dir}/nats",
        secret_files=internal_tls.files("nats", host, "nats") if tls else (), tls=tls,
        provenance=provenance(argv, env, "plan:nats", SOURCE))


# ------------------------------------------------------------------------------------------- Dynamo clients

def dynamo_env(a: str, inputs: ClientInputs, home: str, nats: str = "") -> list[tuple[str, str]]:
    """The env every Dynamo process shares (ETCD_LEASE_TTL: lib/runtime/src/transports/etcd.rs). `nats`: its
    NATS_SERVER when not the workers' seed (a frontend seeds from its own host's NATS)."""
    env = [("HOME", home), ("ETCD_ENDPOINTS", inputs.etcd)] + (
        [("ETCD_LEASE_TTL", str(inputs.lease_ttl))] if inputs.lease_ttl else [])
    if inputs.auth:
        # M3_ETCD_AUTH_TOKEN is not read by Dynamo: it names the etcd token type its login depends on, so that a
        # change of it (simple -> jwt, etcd_jwt_option) changes this env file and restarts the clients, which hold
        # tokens of the old type
        env += [(internal_tls.login_name("ETCD_AUTH_USERNAME", inputs.tls), AUTH_USER), ("M3_ETCD_AUTH_TOKEN", "jwt")]
    env.append(("NATS_SERVER", nats or inputs.nats))
    if inputs.auth:
        env.append(("NATS_AUTH_USERNAME", AUTH_USER))
    # the NATS event plane: with the default (zmq) every process also listens on 0.0.0.0 (docs/DYNAMO.md)
    return env + [("DYN_REQUEST_PLANE", "tcp"), ("DYN_EVENT_PLANE", "nats"), ("DYN_TCP_RPC_HOST", a),
                  ("DYN_TCP_RESPONSE_STREAM_HOST", a), ("DYN_EVENT_PLANE_HOST", a), ("DYN_SYSTEM_HOST", a)]


def dynamo_secret_env(inputs: ClientInputs) -> tuple[tuple[str, str], ...]:
    """The passwords a Dynamo client logs in with (with TLS, etcd's under our scripts' name)."""
    if not inputs.auth:
        return ()
    return tuple((internal_tls.login_name(k, inputs.tls), ref) for k, ref in DYN_SECRET_ENV)


@dataclass(frozen=True)
class ClientTLS:
    """What m3_internal_tls adds to one Dynamo client (none of it without TLS)."""

    env: tuple[tuple[str, str], ...] = ()
    docker: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    launcher: tuple[str, ...] = ()
    provenance: tuple[Provenance, ...] = ()


def client_tls(inputs: ClientInputs, name: str, host: str, image: str | None) -> ClientTLS:
    if not inputs.tls:
        return ClientTLS()
    env, docker = internal_tls.client_env(name), internal_tls.client_docker(image)
    return ClientTLS(env=env, docker=docker, files=internal_tls.client_files(name, host),
                     launcher=internal_tls.client_launcher(name),
                     provenance=provenance((), env, TLS_LAYER, TLS_SOURCE, {"m3_internal_tls": "m3_internal_tls"}))


def _frontend_recipe(c: Any, host: str, a: str, index: int) -> recipes.Resolved:
    s = c.s
    port = int(s["m3_frontend_port"]) + index
    ctx = {**catalog.model_constants(s["m3_engine"]), "address": a, "frontend_port": port, "serving": "dynamo"}
    note = c.note("m3_frontend_port") + (f" + {index} (m3_edge_frontends: frontend {index})" if index else "")
    return recipes.resolve(ctx, target="frontend",
                           sources={"frontend_port": note, "address": c.note("m3_address", host)})


def _frontend_env(c: Any, a: str, home: str, r: recipes.Resolved) -> dict[str, str]:
    """A control host's Dynamo env: its own host's NATS as the seed (every control host runs one; workers seed from
    the first control host), the frontend layers' env, HF offline."""
    env = dict(dynamo_env(a, c.client, home, nats_seed(a, c.client.tls)))
    for k, v in r.env.items():
        env[k] = v
    env["HF_HUB_OFFLINE"] = "1"  # hosts are air-gapped: nothing is fetched from a hub at run time
    return env


def _env_provenance(c: Any, host: str, env: Mapping[str, str], r: recipes.Resolved, layer: str, source: str):
    return tuple(Provenance(f"env:{k}", v, layer, source,
                            c.client.notes.get(k) or c.note(ADDRESS_ENV.get(k, ""), host)) for k, v in env.items()
                 if f"env:{k}" not in r.provenance)


def frontend_service(c: Any, host: str, a: str, index: int = 0) -> Service:
    """The Dynamo frontend number `index` on a control host (index > 0: m3_edge's extra frontends, port + index,
    each its own HOME and env file). `c`: the build's shared choices (core.build._Common)."""
    name = "m3-frontend" if index == 0 else f"m3-frontend-{index}"
    port = int(c.s["m3_frontend_port"]) + index
    r = _frontend_recipe(c, host, a, index)
    env = _frontend_env(c, a, f"{c.home}/{name}", r)
    tls = client_tls(c.client, name, host, None)
    argv = (f"{c.venv}/bin/python", "-m", "dynamo.frontend", *r.argv())
    prov = (r.provenance_records() + launch_provenance(argv[:3], "plan:dynamo", SOURCE, c.note("m3_dynamo_version"))
            + _env_provenance(c, host, env, r, "plan:dynamo", SOURCE) + tls.provenance)
    return Service(
        name=name, kind="frontend", host=host, argv=argv, env=tuple(env.items()) + tls.env,
        secret_env=dynamo_secret_env(c.client), ports=(Port("http", port, a, key="m3_frontend_port"),),
        readiness=Readiness(kind="http", url=f"http://{url_host(a)}:{port}/live", timeout_s=r.readiness_timeout_s),
        after=(f"{host}/etcd", f"{host}/nats"), env_file=f"/etc/m3/{name}.env", workdir=f"{c.home}/{name}",
        provenance=prov, secret_files=tls.files, launcher=tls.launcher, tls=c.client.tls, frontend_index=index)


def client_service(c: Any, name: str, kind: str, host: str, a: str, argv: tuple[str, ...], *, layer: str,
                   source: str, **fields) -> Service:
    """Another Dynamo client on a control host (the planner, its actuator): a frontend's env under its own HOME,
    env file and TLS files."""
    r = _frontend_recipe(c, host, a, 0)
    env = _frontend_env(c, a, f"{c.home}/{name}", r)
    tls = client_tls(c.client, name, host, None)
    prov = (launch_provenance(argv[:1], layer, source, c.note("m3_dynamo_version"))
            + provenance(argv, (), layer, source) + tuple(x for x in r.provenance_records() if x.key.startswith("env:"))
            + _env_provenance(c, host, env, r, "plan:dynamo", SOURCE) + tls.provenance)
    return Service(name=name, kind=kind, host=host, argv=argv, env=tuple(env.items()) + tls.env,
                   secret_env=dynamo_secret_env(c.client), env_file=f"/etc/m3/{name}.env",
                   workdir=f"{c.home}/{name}", secret_files=tls.files, launcher=tls.launcher, tls=c.client.tls,
                   provenance=prov, **fields)
