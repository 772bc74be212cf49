"""inventory -> ClusterPlan: every decision about the cluster, made once, in pure Python, from data.

`build(inventory)` reads the pyinfra inventory's `m3_*` data, lays workers out over hosts, resolves the
recipe layers for each worker rank, and returns frozen dataclasses (m3deploy.core.model). It validates
everything first (m3deploy.core.validate) and raises ValidationError listing every problem at once.
No pyinfra operations, no I/O besides reading the inventory files.
"""
from __future__ import annotations  # noqa: I001 (two lines for the core imports: the module is at its line cap)

import hashlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from m3deploy.core import (catalog, disagg, edge, internal_tls, layout, monitor, mpi, planner, recipes, repos,
                           settings)
from m3deploy.core import simengine
from m3deploy.core.errors import ValidationError
from m3deploy.core.inputs import address_of, url_host
from m3deploy.core.inventory import InvHost, cluster_name, load_inventory
from m3deploy.core.model import (
    ClusterPlan,
    HostPlan,
    ModelRepo,
    Port,
    Provenance,
    Readiness,
    Service,
    WorkerPlan,
)
from m3deploy.core.sections import driver_plan, images_plan, nats_plan, rollout_plan, weights_plan

ETCD_CLIENT, ETCD_PEER, NATS_CLIENT, NATS_MONITOR, NATS_CLUSTER = 2379, 2380, 4222, 8222, 6222
# Passwords live in the controller's 0600 secrets store (m3deploy.controller.secrets); roles write them only into the
# services' 0600 env files. Dynamo 1.6.1 reads ETCD_AUTH_* / NATS_AUTH_* (docs/DYNAMO.md).
AUTH_USER = "m3"
DYN_SECRET_ENV = (("ETCD_AUTH_PASSWORD", "etcd-password"), ("NATS_AUTH_PASSWORD", "nats-password"))
# m3_api_key_file's key: not generated but read from that controller file (m3deploy.controller.secrets.api_key)
API_KEY_SECRET = "api-key"


# ---------------------------------------------------------------------------------------------- inventory
# ---------------------------------------------------------------------------------------------- settings
# ---------------------------------------------------------------------------------------------- build
def build(hosts, name: str | os.PathLike | None = None, facts: Mapping[str, Mapping[str, Any]] | None = None,
          ) -> ClusterPlan:
    """Validate and build the plan: the one builder of every CLI command and of the deploy.

    `hosts`: a list of InvHost (m3deploy.core.inventory) or an inventory path. `name`: the inventory file the hosts
    came from (or a name standing for it); the cluster's name is `inventory.cluster_name`'s (m3_cluster, else the
    file's name). `facts`: {host: {"env": ...}} networking env from the hosts' facts (with_fact_env)."""
    from m3deploy.core import validate

    if isinstance(hosts, (str, os.PathLike)):
        path = Path(hosts)
        hosts = load_inventory(path)
        name = name or path
    name = cluster_name(hosts, name)
    problems = validate.check_inventory(hosts)
    if problems:
        raise ValidationError(problems)
    plan = _build(hosts, name)
    problems = validate.check_plan(plan, hosts)
    if problems:
        raise ValidationError(problems)
    if facts:
        plan = replace(plan, hosts=tuple(with_fact_env(plan, h, (facts.get(h.name) or {}).get("env") or {})
                                         for h in plan.hosts))
    return plan


def with_fact_env(plan: ClusterPlan, hp: HostPlan, env: Mapping[str, str]) -> HostPlan:
    """`hp` with a host's networking env from its facts (m3deploy.core.netenv) added to each multi-host worker
    rank, wherever neither the recipe, the user (m3_interface, m3_rdma_env, m3_extra_env) nor the plan set it
    (provenance "facts"). Overlaid onto the built plan: per-host facts never rebuild it."""
    if not env or catalog.engines()[plan.engine].get("simulated"):
        return hp
    services = []
    for svc in hp.services:
        have = dict(svc.env)
        add = {k: str(v) for k, v in env.items() if svc.kind == "worker" and (svc.nnodes > 1 or disagg.uses_fabric(
            svc)) and k not in have}
        if not add:
            services.append(svc)
            continue
        # provenance as if the plan had set it: a key a layer removed keeps its place, others go before the
        # multi-host flags (the plan's order: recipe, cluster, plan env, facts, multi-host)
        fact = {f"env:{k}": Provenance(f"env:{k}", v, "facts", f"facts of {hp.name}") for k, v in add.items()}
        prov = [fact.pop(p.key) if p.key in fact else p for p in svc.provenance]
        at = next((i for i, p in enumerate(prov) if p.layer == "plan:multi-host"), len(prov))
        services.append(mpi.forwarded(replace(svc, env=svc.env + tuple(add.items()),  # an MPI world's ranks too
                                              provenance=tuple(prov[:at] + list(fact.values()) + prov[at:])), add))
    return replace(hp, services=tuple(services))


@dataclass(frozen=True)
class _Common:
    """What every service of the cluster shares: the settings and the choices derived from them."""

    s: Mapping[str, Any]  # every m3_* setting (settings.cluster_settings: cluster keys from any host, the rest
    #                       from the first worker)
    mode: str  # "tp" | "dp"
    size: int
    ep: bool
    features: tuple[str, ...]
    model_id: str
    served: str
    etcd: str
    nats: str
    venv: str
    model_dir: str
    home: str
    pool: str = ""  # m3_disagg: "prefill" | "decode" (core/disagg.py); "" aggregated


@dataclass(frozen=True)
class _Rank:
    """One rank of one worker on one host."""

    idx: int  # worker index
    rank: int
    nnodes: int
    slot: int  # the rank's slot on its host (ports, unit name)
    host: InvHost
    address: str
    master: str  # rank 0's address
    rank0_host: str
    devices: tuple[int, ...]


def _build(hosts: list[InvHost], name: str) -> ClusterPlan:
    """The plan, in named steps: the shared settings, the control plane, the workers laid over the hosts, the
    scripted engine and the frontends, the endpoint, the model repos, each host's part."""
    control = [h for h in hosts if "control" in h.groups]
    workers = [h for h in hosts if "workers" in h.groups]
    ref = workers[0] if workers else hosts[0]
    addr = {h.name: address_of(h) for h in hosts}
    c = _common(ref, workers, control, addr)
    s, engine, serving = c.s, c.s["m3_engine"], c.s["m3_serving"]
    services: dict[str, list[Service]] = {h.name: [] for h in hosts}
    if c.etcd:
        members = tuple((x.name, addr[x.name]) for x in control)
        for x in control:
            services[x.name] += _control_services(x.name, addr[x.name], c.home, bool(s["m3_auth"]), members, name)
    lay = layout.Layout(c.size, layout.gpus_per_host(ref.data) if workers else 1)
    worker_plans, slots = disagg.lay_pools(c, workers, _lay_workers, addr, services) if disagg.enabled(s) else \
        _lay_workers(c, lay, workers, addr, services)
    # a multi-host worker of an engine launched as one MPI world (engines.yaml mpi_world): mpirun from rank 0
    mpi.apply(services, worker_plans, catalog.engines()[engine], serving, addr)
    if catalog.engines()[engine].get("scripted") and serving == "dynamo" and worker_plans:  # tool-call engine
        h0, w0 = worker_plans[0].hosts[0], worker_plans[0].services[0].split("/", 1)[1]
        worker0 = next(x for x in services[h0] if x.name == w0)
        services[h0].append(simengine.scripted_service(
            worker0, int(s["m3_system_port"]) + slots[h0], c.model_id if worker0.image else c.model_dir, c.served,
            c.home))
    if serving == "dynamo":
        endpoint = _frontends(c, control, workers, addr, services)
    else:
        endpoint = _standalone_endpoint(worker_plans, addr, services)
    if planner.enabled(s):  # the planner and its actuator; the standby hosts' workers installed, not started
        worker_plans = planner.apply(services, worker_plans, hosts, addr, s, c.served)
    internal_tls.apply(services, addr, s)  # m3_internal_tls: etcd and NATS with client certificates
    monitor.add_services(services, hosts, s, addr)  # m3_monitor: exporters everywhere, Prometheus (core/monitor.py)
    model_repos = _model_repos(c, hosts, services)
    host_plans = [_host_plan(c, h, addr[h.name], services[h.name], lay.span) for h in hosts]
    recorded = tuple(sorted((k, _jsonable(s[k])) for k in settings.CLUSTER_KEYS
                            if k in s and (s[k] or not settings.KEYS[k].omit_unset))) + (
        ("m3_features_effective", list(c.features)),)
    return ClusterPlan(
        name=name, platform=settings.get(ref.data, "m3_platform") or "", variant=s["m3_variant"],
        parallel=str(s["m3_parallel"]), engine=engine, serving=serving, features=c.features, model_id=c.model_id,
        served_model_name=c.served, max_model_len=s["m3_max_model_len"], state=str(s["m3_state"]),
        hosts=tuple(host_plans), workers=tuple(worker_plans), endpoint=endpoint, etcd_endpoints=c.etcd,
        nats_server=c.nats, dynamo_version=str(s["m3_dynamo_version"]) if (serving == "dynamo") else "",
        venv=c.venv if serving == "dynamo" else "", model_dir=c.model_dir, model_repos=model_repos,
        rollout=rollout_plan(s), nats=nats_plan(s, name) if c.nats else None, settings=recorded)


def _common(ref: InvHost, workers: list[InvHost], control: list[InvHost], addr: Mapping[str, str]) -> _Common:
    """The settings (cluster keys from any host) and the choices every service shares."""
    s = settings.cluster_settings(ref.data, [h.data for h in workers + control])
    mode, size, ep = settings.parse_parallel(s["m3_parallel"])
    model_id = s["m3_model_id"] or catalog.catalog()["variants"][s["m3_variant"]]["model_id"]
    state_dir = s["m3_state_dir"]
    etcd_url = nats_url = ""
    if s["m3_serving"] == "dynamo" and control:
        # one control host: etcd + NATS on it; 3 (validate.control_count): a 3-member etcd and a 3-node NATS
        # cluster, one member per control host (docs/OPERATIONS.md "HA control plane")
        etcd_url = ",".join(f"{internal_tls.scheme(s)}://{url_host(addr[x.name])}:{ETCD_CLIENT}" for x in control)
        nats_url = nats_seed(addr[control[0].name])
    return _Common(
        s=s, mode=mode, size=size, ep=ep, features=settings.effective_features(s["m3_features"]), model_id=model_id,
        served=s["m3_served_model_name"] or model_id, etcd=etcd_url, nats=nats_url,
        venv=f"{s['m3_venv_root']}/dynamo-{s['m3_dynamo_version']}",
        model_dir=f"{state_dir}/models/mock-minimax-m3" if catalog.engines()[s["m3_engine"]].get("simulated")
        else s["m3_hf_cache"],
        home=state_dir)  # each native service gets its own writable HOME under it: <state_dir>/<unit name>


def _lay_workers(c: _Common, lay: layout.Layout, workers: list[InvHost], addr: Mapping[str, str],
                 services: dict[str, list[Service]], start: int = 0) -> tuple[list[WorkerPlan], dict[str, int]]:
    """Lay engine instances over the worker hosts (core.layout): each rank's service added to its host's;
    returns the workers (indices from `start`) and how many slots each host uses."""
    worker_plans: list[WorkerPlan] = []
    slots: dict[str, int] = {h: 0 for h in addr}
    for group in lay.groups(workers):
        for k in range(lay.per_host):
            devices, svc_names, rank0, widx = lay.devices(k), [], group[0], start + len(worker_plans)
            for rank, h in enumerate(group):
                svc = _worker_service(c, _Rank(
                    idx=widx, rank=rank, nnodes=lay.span, slot=slots[h.name], host=h, address=addr[h.name],
                    master=addr[rank0.name], rank0_host=rank0.name, devices=devices))
                slots[h.name] += 1
                services[h.name].append(svc)
                svc_names.append(f"{h.name}/{svc.name}")
            worker_plans.append(WorkerPlan(index=widx, hosts=tuple(g.name for g in group),
                                           tensor_parallel=c.size if c.mode == "tp" else 1,
                                           data_parallel=c.size if c.mode == "dp" else 1,
                                           gpus_per_rank=len(devices), services=tuple(svc_names)))
    return worker_plans, slots


def _frontends(c: _Common, control: list[InvHost], workers: list[InvHost], addr: Mapping[str, str],
               services: dict[str, list[Service]]) -> str:
    """A Dynamo frontend on every control host, after its control plane; rank 0 of each worker (and the scripted
    engine) after the first frontend. Returns the endpoint: the first control host's frontend."""
    for x in control:
        services[x.name].append(_frontend_service(c, x, addr[x.name]))
    fe = f"{control[0].name}/m3-frontend" if control else ""
    for h in workers:
        services[h.name] = [_with_after(x, (fe,)) if x.kind in ("worker", "scripted") and x.rank == 0 and fe else x
                            for x in services[h.name]]
    if not control:
        return ""
    if edge.enabled(c.s):  # HAProxy in front of the frontends: the endpoint is the edge's (core/edge.py)
        return edge.apply(services, [x.name for x in control], addr, c.s)
    return f"http://{url_host(addr[control[0].name])}:{c.s['m3_frontend_port']}/v1"


def _standalone_endpoint(worker_plans: list[WorkerPlan], addr: Mapping[str, str],
                         services: dict[str, list[Service]]) -> str:
    """Standalone engines: the endpoint is worker 0's own HTTP server."""
    if not worker_plans:
        return ""
    hname, sname = worker_plans[0].services[0].split("/")
    port = next(x for x in services[hname] if x.name == sname).port("http").port
    return f"http://{url_host(addr[hname])}:{port}/v1"


def _model_repos(c: _Common, hosts: list[InvHost], services: dict[str, list[Service]]) -> tuple[ModelRepo, ...]:
    """Every Hugging Face repo a worker loads (staged offline), or the testbed's mock copy of the target."""
    rules = catalog.engines()[c.s["m3_engine"]]
    repo_args = rules.get("repo_args") or {}
    model_repos = repos.merge(r for h in hosts for x in services[h.name] if x.kind == "worker"
                              and (not rules.get("simulated") or x.image)  # the docker testbed: staged mock repos
                              for r in repos.worker_repos(x.argv, c.model_id, repo_args))
    # testbed: mock copies staged like real repos (docs/WEIGHTS.md)
    if c.s["m3_mock_repo_mb"] and not model_repos and repos.is_repo_id(c.model_id):
        model_repos = (ModelRepo(c.model_id, "target", "m3_mock_repo_mb"),)
    return model_repos


def _host_plan(c: _Common, h: InvHost, address: str, services: list[Service], span: int) -> HostPlan:
    """One host's part: its GPUs (workers), weights, driver, images, and its services in start order."""
    s, mock_mb = c.s, c.s["m3_mock_repo_mb"]
    is_worker = "workers" in h.groups
    plat = str(settings.get(h.data, "m3_platform") or "") if is_worker else ""
    info = catalog.platform(plat) if plat else {}
    vendor = info.get("vendor", "")
    gpus = layout.gpus_per_host(h.data) if is_worker and vendor in ("nvidia", "amd") else 0
    weights_dir = s["m3_hf_cache"] if gpus or (mock_mb and is_worker) else ""
    disk_gb = int(catalog.catalog()["variants"][s["m3_variant"]]["disk_gb"])
    return HostPlan(
        name=h.name, address=address,
        groups=tuple(g for g in ("control", "workers", monitor.MONITOR_GROUP, planner.STANDBY_GROUP) if g in h.groups),
        platform=plat, gpu_vendor=vendor if vendor in ("nvidia", "amd") else "",
        gpu_model=info.get("gpu_model", "") if gpus else "", gpus=gpus,
        gpu_memory_gb=int(h.data.get("m3_gpu_memory_gb") or info.get("gpu_memory_gb", 0)) if gpus else 0,
        interface=str(h.data.get("m3_interface") or ""), weights_dir=weights_dir,
        weights_gb=disk_gb if gpus else -(-mock_mb // 1024) if mock_mb and is_worker else 0,
        shm_min_gb=16 if gpus else 0, needs_rdma=bool(is_worker and span > 1 and gpus),
        driver=driver_plan(h.data, plat, vendor) if gpus else None,
        images=images_plan(h.data, s["m3_image_pull"]) if gpus or any(x.image for x in services) else None,
        weights=weights_plan(h.data, services, c.venv if s["m3_serving"] == "dynamo" else "")
        if weights_dir else None,
        preflight_ignore=tuple(str(x) for x in settings.get(h.data, "m3_preflight_ignore")),
        services=tuple(services), data=tuple(sorted((k, v) for k, v in h.data.items() if k.startswith("m3_"))))


def _fill(value, fill: Mapping[str, Any]) -> str | None:
    """engines.yaml's `{name}` placeholders, filled from the plan (None stays a boolean flag)."""
    return None if value is None else re.sub(r"\{([a-z_]+)\}", lambda m: str(fill[m.group(1)]), str(value))


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v


def _with_after(svc: Service, after: tuple[str, ...]) -> Service:
    return replace(svc, after=tuple(dict.fromkeys(svc.after + after)))


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


def nats_seed(a: str) -> str:
    """NATS_SERVER: ONE URL. Dynamo 1.6.1 passes it as a String to async-nats's connect(), whose
    `impl ToServerAddrs for str` parses a single ServerAddr (nats-io/nats.rs async-nats/src/lib.rs), so a list
    is refused. In a NATS cluster the client learns the other servers from the seed's INFO `connect_urls` and
    fails over to them; only a process (re)started while its seed is down waits for it (docs/OPERATIONS.md)."""
    return f"nats://{url_host(a)}:{NATS_CLIENT}"


def _control_services(host: str, a: str, state_dir: str, auth: bool, members: tuple[tuple[str, str], ...],
                      cluster: str) -> list[Service]:
    """etcd + NATS on one control host; `members`: (name, address) of every control host, this one included.
    Peer traffic (etcd 2380, NATS routes 6222) is plain TCP on the cluster addresses, like the client traffic:
    the cluster network is trusted (docs/OPERATIONS.md). Only the first member turns etcd auth on (it is
    cluster-wide data; members running the script at once would race on `auth enable`)."""
    u = url_host(a)  # an IPv6 address in brackets (RFC 3986)
    first = members[0][0] == host
    cluster_flags: tuple[str, ...] = ()
    if len(members) > 1:  # a new cluster's identity; both are ignored once the data dir exists
        cluster_flags = ("--initial-cluster-state", "new", "--initial-cluster-token", f"m3-{cluster}")
    etcd = Service(
        name="etcd", kind="etcd", host=host,
        argv=("/usr/bin/etcd", "--name", host, "--data-dir", f"{state_dir}/etcd/data",
              "--listen-client-urls", f"http://{u}:{ETCD_CLIENT}", "--advertise-client-urls", f"http://{u}:{ETCD_CLIENT}",
              "--listen-peer-urls", f"http://{u}:{ETCD_PEER}", "--initial-advertise-peer-urls", f"http://{u}:{ETCD_PEER}",
              "--initial-cluster", ",".join(f"{n}=http://{url_host(m)}:{ETCD_PEER}" for n, m in members))
        + cluster_flags + (("--auth-token", etcd_jwt_option(f"{state_dir}/etcd")) if auth else ()),
        env=(("M3_ETCD_URL", f"http://{u}:{ETCD_CLIENT}"), ("M3_ETCD_USER", AUTH_USER)) if auth and first else (),
        secret_env=(("M3_ETCD_ROOT_PASSWORD", "etcd-root-password"), ("M3_ETCD_PASSWORD", "etcd-password"))
        if auth and first else (),
        ports=(Port("client", ETCD_CLIENT, a), Port("peer", ETCD_PEER, a)),
        readiness=Readiness(kind="http", url=f"http://{u}:{ETCD_CLIENT}/health", expect_json=(("health", "true"),),
                            timeout_s=60),
        env_file="/etc/m3/etcd.env", workdir=f"{state_dir}/etcd")
    # NATS routes to the other nodes, as M3_NATS_ROUTE_<i> (nats.conf names the variables): nats-server 2.9 sends
    # no credentials on a route whose URL has none, so with auth the URL carries the route user's password and
    # lives in the 0600 env file (a secret_env value "{secret-name}" is filled from the secrets store)
    routes = [f"nats-route://{AUTH_USER + ':{nats-password}@' if auth else ''}{url_host(m)}:{NATS_CLUSTER}"
              for n, m in members if n != host]
    route_env = tuple((f"M3_NATS_ROUTE_{i}", r) for i, r in enumerate(routes))
    nats = Service(
        name="nats", kind="nats", host=host,
        argv=("/usr/sbin/nats-server", "-c", "/etc/m3/nats.conf"),
        env=((("NATS_AUTH_USERNAME", AUTH_USER),) if auth else route_env),
        secret_env=(("NATS_AUTH_PASSWORD", "nats-password"),) + route_env if auth else (),
        ports=(Port("client", NATS_CLIENT, a), Port("monitor", NATS_MONITOR, a))
        + ((Port("cluster", NATS_CLUSTER, a),) if len(members) > 1 else ()),
        readiness=Readiness(kind="http", url=f"http://{u}:{NATS_MONITOR}/healthz?js-enabled-only=true", timeout_s=60),
        env_file="/etc/m3/nats.env", workdir=f"{state_dir}/nats")
    return [etcd, nats]


def _dynamo_env(a: str, etcd: str, nats: str, home: str, s) -> list[tuple[str, str]]:
    auth, ttl = bool(s["m3_auth"]), s.get("m3_etcd_lease_ttl")  # ETCD_LEASE_TTL: lib/runtime/src/transports/etcd.rs
    env = [("HOME", home), ("ETCD_ENDPOINTS", etcd)] + ([("ETCD_LEASE_TTL", str(ttl))] if ttl else [])
    if auth:
        # not read by Dynamo: names the etcd token type its login depends on, so that a change of it (simple ->
        # jwt, etcd_jwt_option) changes this env file and restarts the clients, which hold tokens of the old type
        env += [("ETCD_AUTH_USERNAME", AUTH_USER), ("M3_ETCD_AUTH_TOKEN", "jwt")]
    env.append(("NATS_SERVER", nats))
    if auth:
        env.append(("NATS_AUTH_USERNAME", AUTH_USER))
    # the NATS event plane: with the default (zmq) every process also listens on 0.0.0.0 (docs/DYNAMO.md)
    return env + [("DYN_REQUEST_PLANE", "tcp"), ("DYN_EVENT_PLANE", "nats"), ("DYN_TCP_RPC_HOST", a),
                  ("DYN_TCP_RESPONSE_STREAM_HOST", a), ("DYN_EVENT_PLANE_HOST", a), ("DYN_SYSTEM_HOST", a)]


def _frontend_service(c: _Common, h: InvHost, a: str) -> Service:
    s, etcd, venv, home = c.s, c.etcd, c.venv, c.home
    ctx = {**catalog.model_constants(s["m3_engine"]), "address": a, "frontend_port": s["m3_frontend_port"],
           "serving": "dynamo"}
    r = recipes.resolve(ctx, target="frontend")
    # its own host's NATS as the seed (every control host runs one); workers seed from the first control host
    env = dict(_dynamo_env(a, etcd, nats_seed(a), f"{home}/m3-frontend", s))
    for k, v in r.env.items():
        env[k] = v
    env["HF_HUB_OFFLINE"] = "1"  # hosts are air-gapped: nothing is fetched from a hub at run time
    argv = (f"{venv}/bin/python", "-m", "dynamo.frontend", *r.argv())
    prov = r.provenance_records() + tuple(Provenance(f"env:{k}", v, "plan:dynamo", "m3deploy/core/build.py")
                                          for k, v in env.items() if f"env:{k}" not in r.provenance)
    port = int(s["m3_frontend_port"])
    return Service(
        name="m3-frontend", kind="frontend", host=h.name, argv=argv, env=tuple(env.items()),
        secret_env=DYN_SECRET_ENV if s["m3_auth"] else (),
        ports=(Port("http", port, a),),
        readiness=Readiness(kind="http", url=f"http://{url_host(a)}:{port}/live", timeout_s=r.readiness_timeout_s),
        after=(f"{h.name}/etcd", f"{h.name}/nats"),
        env_file="/etc/m3/m3-frontend.env", workdir=f"{home}/m3-frontend", provenance=prov)


CLUSTER_LAYER, PLAN_SOURCE = "cluster", "m3deploy/core/build.py"  # provenance: a cluster setting; the plan itself


def _worker_service(c: _Common, rk: _Rank) -> Service:
    """One worker rank's service, in named steps: recipe layers, the user's overrides, the container image, the
    endpoints (ports, readiness, plan env), multi-host flags, the launch line, the docker flags."""
    s, engine, serving = c.s, c.s["m3_engine"], c.s["m3_serving"]
    info = catalog.platform(str(settings.get(rk.host.data, "m3_platform")))
    rules = catalog.engines()[engine]
    ports = {"kv": int(s["m3_kv_events_port"]) + rk.slot, "system": int(s["m3_system_port"]) + rk.slot,
             "http": int(s["m3_worker_port"]) + rk.slot}
    r = recipes.resolve(_worker_ctx(c, rk, info, ports["kv"]), target="worker")
    fill = {"model_id": c.model_id, "served": c.served, "model_dir": c.model_dir, "venv": c.venv,
            "address": rk.address, "http_port": ports["http"], "nnodes": rk.nnodes, "rank": rk.rank,
            "master": rk.master, "master_url_host": url_host(rk.master), "master_port": s["m3_master_port"]}
    _user_overrides(c, rk, r, rules, fill)
    timeout = int(s["m3_readiness_timeout_s"] or r.readiness_timeout_s)
    if rules.get("readiness_extra_s"):
        timeout += int(s[rules["readiness_extra_s"]] or 0)
    # a simulated engine runs in the stand-in engine image with m3_runtime=docker (m3_image overrides it), else
    # natively
    sim_image = bool(rules.get("simulated")) and s["m3_runtime"] == "docker"
    image = (r.image or simengine.sim_image(str(s["m3_dynamo_version"]))) if sim_image else \
        (None if rules.get("simulated") else r.image)
    svc_ports, readiness = _worker_endpoints(c, rk, r, rules, info, ports, image, timeout)
    svc_ports, readiness = _multi_host(rk, r, rules, fill, svc_ports, readiness, timeout)
    svc_ports += disagg.ports(r.argv(), r.env, rk.address, rules)  # m3_disagg: KV-transfer ports
    head = _launch_line(c, r, rules, fill)
    docker = _docker_args(c, rk, r, info) if image else []
    files = _engine_files(c, rk, r, rules, docker if image else None)
    image, base_image = _dynamo_image(c, rules, image, sim_image)
    name = f"m3-worker@{rk.slot}"
    # the engine's own HTTP server checks the key (rank 0 serves; headless ranks have no API server)
    api_key_env = ((rules["api_key_env"], API_KEY_SECRET),) if (
        serving != "dynamo" and rk.rank == 0 and s["m3_api_key_file"] and rules.get("api_key_env")) else ()
    return Service(
        name=name, kind="worker", host=rk.host.name, argv=head + tuple(r.argv()), env=tuple(r.env.items()),
        secret_env=(DYN_SECRET_ENV if (serving == "dynamo" and s["m3_auth"]) else ()) + api_key_env,
        image=image, base_image=base_image, docker_args=tuple(docker), ports=tuple(svc_ports), readiness=readiness,
        after=((f"{rk.rank0_host}/{name}",) if rk.rank > 0 else ()),  # whole hosts: same slot
        env_file=f"/etc/m3/{name}.env", workdir="" if image else f"{c.home}/{name}",  # a native process: its own
        worker=rk.idx, rank=rk.rank, nnodes=rk.nnodes,
        devices=rk.devices if info["vendor"] in ("nvidia", "amd") else (), provenance=r.provenance_records(),
        files=files)


def _worker_ctx(c: _Common, rk: _Rank, info: Mapping[str, Any], kv_port: int) -> dict[str, Any]:
    """What the recipe layers' `when:` and `{placeholders}` read for this rank."""
    s = c.s
    sizes = sorted(set(int(x) for x in s["m3_cudagraph_capture_sizes"]) | {256, 512, 1024, 2048})
    return {
        **catalog.model_constants(s["m3_engine"]), "engine": s["m3_engine"], "serving": s["m3_serving"],
        "runtime": s["m3_runtime"], "vendor": info["vendor"], "generation": info["generation"],
        "platform": str(settings.get(rk.host.data, "m3_platform")), "variant": s["m3_variant"],
        "parallel": str(s["m3_parallel"]), "ep": c.ep, "dp_mode": c.mode == "dp", "multi_host": rk.nnodes > 1,
        "features": c.features, "tp": c.size, "dp": c.size, "address": rk.address,
        "address_url_host": url_host(rk.address), "kv_events_port": kv_port,
        "device_ids": ",".join(str(d) for d in rk.devices), "max_model_len": s["m3_max_model_len"],
        "max_num_seqs": s["m3_max_num_seqs"], "mocker_speedup_ratio": s["m3_mocker_speedup_ratio"],
        "cudagraph_capture_sizes": json.dumps(sizes, separators=(",", ":")),
        **disagg.ctx(s, c.pool, rk.slot, c.size)}


def _user_overrides(c: _Common, rk: _Rank, r: recipes.Resolved, rules: Mapping[str, Any], fill: dict) -> None:
    """The cluster's settings over the layers: the last layer (m3_image, the context cap, the mocker's flags,
    m3_unset_args, m3_extra_args, the host's m3_rdma_env, m3_extra_env)."""
    s, src = c.s, f"group_data ({rk.host.name})"
    if s["m3_image"]:
        r.image = s["m3_image"]
        r.provenance["image"] = (r.image, f"{CLUSTER_LAYER}:m3_image", src)
    if s["m3_max_model_len"]:
        r.set_arg(catalog.by_serving(rules["max_model_len"], s["m3_serving"]), str(s["m3_max_model_len"]),
                  f"{CLUSTER_LAYER}:m3_max_model_len", src)
    if rules.get("simulated") and s["m3_runtime"] == "docker":  # the staged mock repos, named as a GPU worker's
        fill["model_dir"] = c.model_id
        r.set_arg("--speculative-config", simengine.draft_config(), "plan:sim-docker", PLAN_SOURCE)
    for key, flag in (rules.get("settings_args") or {}).items():
        if s[key]:
            r.set_arg(flag, str(s[key]), f"{CLUSTER_LAYER}:{key}", src)
    for key in s["m3_unset_args"] or ():
        r.unset(str(key), f"{CLUSTER_LAYER}:m3_unset_args", src)
    for flag, value in recipes.parse_arg_list(s["m3_extra_args"] or []):
        r.set_arg(flag, value, f"{CLUSTER_LAYER}:m3_extra_args", src)
    for k, v in dict(rk.host.data.get("m3_rdma_env") or {}).items():
        r.set_env(k, v, f"{CLUSTER_LAYER}:m3_rdma_env", src)
    for k, v in (s["m3_extra_env"] or {}).items():
        r.set_env(k, v, f"{CLUSTER_LAYER}:m3_extra_env", src)
    disagg.overrides(r, s, c.pool, recipes.parse_arg_list)  # m3_disagg's pool: over the cluster's


def _worker_endpoints(c: _Common, rk: _Rank, r: recipes.Resolved, rules: Mapping[str, Any],
                      info: Mapping[str, Any], ports: Mapping[str, int], image: str | None,
                      timeout: int) -> tuple[list[Port], Readiness]:
    """The rank's ports and readiness (Dynamo: its system port; standalone: its HTTP port), and the env the plan
    sets where neither a layer nor the user did (Dynamo's, HF offline, the multi-host socket interface, AMD's
    device list)."""
    s, host, address = c.s, rk.host, rk.address
    plan_env: list[tuple[str, str]] = []
    if s["m3_serving"] == "dynamo":
        whome = "/root" if image else f"{c.home}/m3-worker@{rk.slot}"  # a native process: its own HOME
        plan_env += _dynamo_env(address, c.etcd, c.nats, whome, s)
        plan_env += [("DYN_SYSTEM_PORT", str(ports["system"])),
                     ("DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS", '["generate"]')]
        out = [Port("system", ports["system"], address)]
        if rules.get("kv_events"):
            out.append(Port("kv-events", ports["kv"], address))
        health = ports["system"]
    else:
        out, health = [Port("http", ports["http"], address)], ports["http"]
    readiness = Readiness(kind="http", url=f"http://{url_host(address)}:{health}/health", timeout_s=timeout)
    plan_env.append(("HF_HUB_OFFLINE", "1"))
    if not rules.get("simulated"):  # GPU env
        if rk.nnodes > 1 and host.data.get("m3_interface"):
            plan_env += [("NCCL_SOCKET_IFNAME", str(host.data["m3_interface"])),
                         ("GLOO_SOCKET_IFNAME", str(host.data["m3_interface"]))]
        if info["vendor"] == "amd" and len(rk.devices) < layout.gpus_per_host(host.data):
            plan_env.append(("HIP_VISIBLE_DEVICES", ",".join(map(str, rk.devices))))
    for k, v in plan_env:
        if k not in r.env:
            r.set_env(k, v, "plan", PLAN_SOURCE)
    return out, readiness


def _multi_host(rk: _Rank, r: recipes.Resolved, rules: Mapping[str, Any], fill: Mapping[str, Any],
                ports: list[Port], readiness: Readiness, timeout: int) -> tuple[list[Port], Readiness]:
    """Multi-host ranks: engines.yaml's `multi_host` flags; ranks > 0 are headless, with process-alive readiness
    and without the ports engines.yaml's `followers_without` names (rank 0 starts first)."""
    if rk.nnodes <= 1:
        return ports, readiness
    multi = rules.get("multi_host") or {}
    for flag, value in {**multi.get("all", {}), **(multi.get("followers", {}) if rk.rank > 0 else {})}.items():
        r.set_arg(flag, _fill(value, fill), "plan:multi-host", PLAN_SOURCE)
    if rk.rank > 0:
        readiness = Readiness(kind="process", timeout_s=timeout)
        ports = [p for p in ports if p.name not in rules.get("followers_without", ())]
    return ports, readiness


def _launch_line(c: _Common, r: recipes.Resolved, rules: Mapping[str, Any], fill: Mapping[str, Any]) -> tuple:
    """engines.yaml's launch line for the serving mode; standalone engines also get its standalone flags and
    the served name."""
    serving = c.s["m3_serving"]
    head = tuple(_fill(tok, fill) for tok in rules["launch"][serving])
    if serving != "dynamo":
        extra = dict(rules.get("standalone_args") or {})
        if rules.get("served_name_flag") and c.served != c.model_id:
            extra[rules["served_name_flag"]] = "{served}"
        for flag, value in extra.items():
            r.set_arg(flag, _fill(value, fill), "plan", PLAN_SOURCE)
    return head


def _docker_args(c: _Common, rk: _Rank, r: recipes.Resolved, info: Mapping[str, Any]) -> list[str]:
    """`docker run` flags before the image: the layers', the NVIDIA GPUs of this rank, the HF cache mount."""
    docker = list(r.docker)
    if info["vendor"] == "nvidia":
        gpus_total = layout.gpus_per_host(rk.host.data)
        sel = "all" if len(rk.devices) >= gpus_total else '"device=' + ",".join(map(str, rk.devices)) + '"'
        docker += ["--gpus", sel]
    return docker + ["-v", f"{c.s['m3_hf_cache']}:/root/.cache/huggingface"]


def _engine_files(c: _Common, rk: _Rank, r: recipes.Resolved, rules: Mapping[str, Any],
                  docker: list[str] | None) -> tuple[tuple[str, str], ...]:
    """engines.yaml's `engine_file` under Dynamo (TensorRT-LLM's engine YAML): a host file the worker's flag names,
    mounted read-only into its container (`docker`, None for a native process)."""
    engine_file = rules.get("engine_file") if c.s["m3_serving"] == "dynamo" else None
    if not engine_file:
        return ()
    path = engine_file["path"].format(slot=rk.slot)
    r.set_arg(engine_file["flag"], path, "plan:engine-file", "m3deploy/core/data/engines.yaml")
    if docker is not None:
        docker += ["-v", f"{path}:{path}:ro"]
    return ((path, yaml.safe_dump(engine_file["options"], sort_keys=True)),)


def _dynamo_image(c: _Common, rules: Mapping[str, Any], image: str | None,
                  sim_image: bool) -> tuple[str | None, str | None]:
    """(image, base_image): under Dynamo an engine image runs Dynamo inside it, so the images role builds this
    image on the host, offline, FROM the engine image plus the shipped ai-dynamo wheels (the GB200 lane
    pip-installs ai-dynamo into vLLM's image); the stand-in image holds the Dynamo venv already, and Dynamo's own
    runtime images (engines.yaml `images:` with `dynamo:` the pinned version) bundle it."""
    bundled = str((rules.get("images") or {}).get(image or "", {}).get("dynamo", "")) == str(c.s["m3_dynamo_version"])
    if not image or c.s["m3_serving"] != "dynamo" or sim_image or bundled:
        return image, None
    tag = hashlib.sha256(image.encode()).hexdigest()[:12]
    return f"m3deploy/dynamo-{c.s['m3_engine']}:{c.s['m3_dynamo_version']}-{tag}", image
