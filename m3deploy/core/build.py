"""inventory -> ClusterPlan: every decision about the cluster, made once, in pure Python, from data.

`build(inventory)` reads the pyinfra inventory's `m3_*` data, lays workers out over hosts, resolves the
recipe layers for each worker rank, and returns frozen dataclasses (m3deploy.core.model). It validates
everything first (m3deploy.core.validate) and raises ValidationError listing every problem at once.
No pyinfra operations, no I/O besides reading the inventory files.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from m3deploy.core import catalog, edge, layout, mpi, recipes, repos, settings, simengine
from m3deploy.core.errors import ValidationError
from m3deploy.core.inputs import address_of, url_host
from m3deploy.core.inventory import InvHost, cluster_name, load_inventory
from m3deploy.core.model import (ClusterPlan, HostPlan, ModelRepo, Port, Provenance, Readiness, Service,
                                 WorkerPlan)

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
def build(hosts, name: str | None = None, facts: Mapping[str, Mapping[str, Any]] | None = None) -> ClusterPlan:
    """Validate and build the plan. `hosts`: a list of InvHost (m3deploy.core.inventory) or an inventory path."""
    from m3deploy.core import validate

    if isinstance(hosts, (str, os.PathLike)):
        path = Path(hosts)
        hosts = load_inventory(path)
        name = name or path.stem
    name = cluster_name(hosts, name or "cluster")
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
    if not env or plan.engine == "mocker":
        return hp
    services = []
    for svc in hp.services:
        have = dict(svc.env)
        add = {k: str(v) for k, v in env.items() if svc.kind == "worker" and svc.nnodes > 1 and k not in have}
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

    s: Mapping[str, Any]  # every m3_* setting (settings.DEFAULTS filled in), from the first worker
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
    cat = catalog.catalog()
    control = [h for h in hosts if "control" in h.groups]
    workers = [h for h in hosts if "workers" in h.groups]
    ref = workers[0] if workers else hosts[0]
    s = {k: settings.get(ref.data, k) for k in settings.DEFAULTS}
    variant, engine, serving = s["m3_variant"], s["m3_engine"], s["m3_serving"]
    features = settings.effective_features(s["m3_features"])
    mode, size, ep = settings.parse_parallel(s["m3_parallel"])
    model_id = s["m3_model_id"] or cat["variants"][variant]["model_id"]
    served = s["m3_served_model_name"] or model_id
    platform = settings.get(ref.data, "m3_platform") or ""
    state_dir = s["m3_state_dir"]
    venv = f"{s['m3_venv_root']}/dynamo-{s['m3_dynamo_version']}"
    model_dir = f"{state_dir}/models/mock-minimax-m3" if engine == "mocker" else s["m3_hf_cache"]
    home = state_dir  # each native service gets its own writable HOME under it: <state_dir>/<unit name>
    addr = {h.name: address_of(h) for h in hosts}

    services: dict[str, list[Service]] = {h.name: [] for h in hosts}
    etcd_url = nats_url = ""
    if serving == "dynamo" and control:
        # one control host: etcd + NATS on it; 3 (validate.control_count): a 3-member etcd and a 3-node NATS
        # cluster, one member per control host (docs/OPERATIONS.md "HA control plane")
        members = tuple((c.name, addr[c.name]) for c in control)
        etcd_url = ",".join(f"http://{url_host(a)}:{ETCD_CLIENT}" for _, a in members)
        nats_url = nats_seed(addr[control[0].name])
        for c in control:
            services[c.name] += _control_services(c.name, addr[c.name], state_dir, bool(s["m3_auth"]), members, name)

    common = _Common(s=s, mode=mode, size=size, ep=ep, features=features, model_id=model_id, served=served,
                     etcd=etcd_url, nats=nats_url, venv=venv, model_dir=model_dir, home=home)
    # Workers: lay engine instances over hosts.
    gpus_per_host = {h.name: layout.gpus_per_host(h.data) for h in workers}
    lay = layout.Layout(size, gpus_per_host[ref.name] if workers else 1)
    span = lay.span
    worker_plans: list[WorkerPlan] = []
    slot_count: dict[str, int] = {h.name: 0 for h in hosts}
    widx = 0
    for group in lay.groups(workers):
        for k in range(lay.per_host):
            devices = lay.devices(k)
            svc_names = []
            rank0 = group[0]
            for rank, h in enumerate(group):
                slot = slot_count[h.name]
                slot_count[h.name] += 1
                svc = _worker_service(common, _Rank(
                    idx=widx, rank=rank, nnodes=span, slot=slot, host=h, address=addr[h.name],
                    master=addr[rank0.name], rank0_host=rank0.name, devices=devices))
                services[h.name].append(svc)
                svc_names.append(f"{h.name}/{svc.name}")
            worker_plans.append(WorkerPlan(index=widx, hosts=tuple(g.name for g in group),
                                           tensor_parallel=size if mode == "tp" else 1,
                                           data_parallel=size if mode == "dp" else 1,
                                           gpus_per_rank=len(devices), services=tuple(svc_names)))
            widx += 1

    # a multi-host worker of an engine launched as one MPI world (engines.yaml mpi_world): mpirun from rank 0
    mpi.apply(services, worker_plans, catalog.engines()[engine], serving, addr)
    if engine == "mocker" and serving == "dynamo" and worker_plans:  # the tool-call engine beside the mocker
        h0, w0 = worker_plans[0].hosts[0], worker_plans[0].services[0].split("/", 1)[1]
        worker0 = next(x for x in services[h0] if x.name == w0)
        services[h0].append(simengine.scripted_service(
            worker0, int(s["m3_system_port"]) + slot_count[h0], model_id if worker0.image else model_dir, served, home))
    if serving == "dynamo":
        for c in control:
            services[c.name].append(_frontend_service(common, c, addr[c.name]))
            # the frontend starts after the control plane; workers after the frontend
        fe = f"{control[0].name}/m3-frontend" if control else ""
        for h in workers:
            services[h.name] = [_with_after(x, (fe,)) if x.kind in ("worker", "scripted") and x.rank == 0 and fe else x
                                for x in services[h.name]]
        endpoint = f"http://{url_host(addr[control[0].name])}:{s['m3_frontend_port']}/v1" if control else ""
        if edge.enabled(s) and control:  # HAProxy in front of the frontends: the endpoint is the edge's
            endpoint = edge.apply(services, [c.name for c in control], addr, s)
    else:
        first = worker_plans[0].services[0] if worker_plans else ""
        endpoint = ""
        if first:
            hname, sname = first.split("/")
            port = next(p.port for p in next(x for x in services[hname] if x.name == sname).ports if p.name == "http")
            endpoint = f"http://{url_host(addr[hname])}:{port}/v1"

    repo_args = catalog.engines()[engine].get("repo_args") or {}
    model_repos = repos.merge(r for h in hosts for x in services[h.name] if x.kind == "worker"
                              and (engine != "mocker" or x.image)  # the docker testbed loads its staged mock repos
                              for r in repos.worker_repos(x.argv, model_id, repo_args))
    mock_mb = s["m3_mock_repo_mb"]  # testbed: mock copies staged like real repos (docs/WEIGHTS.md)
    if mock_mb and not model_repos and repos.is_repo_id(model_id):
        model_repos = (ModelRepo(model_id, "target", "m3_mock_repo_mb"),)
    host_plans = []
    for h in hosts:
        is_worker = "workers" in h.groups
        plat = str(settings.get(h.data, "m3_platform") or "") if is_worker else ""
        info = catalog.platform(plat) if plat else {}
        vendor = info.get("vendor", "")
        gpus = gpus_per_host.get(h.name, 0) if is_worker and vendor in ("nvidia", "amd") else 0
        data = tuple(sorted((k, v) for k, v in h.data.items() if k.startswith("m3_")))
        host_plans.append(HostPlan(
            name=h.name, address=addr[h.name], groups=tuple(g for g in ("control", "workers") if g in h.groups),
            platform=plat, gpu_vendor=vendor if vendor in ("nvidia", "amd") else "",
            gpu_model=info.get("gpu_model", "") if gpus else "", gpus=gpus,
            gpu_memory_gb=int(h.data.get("m3_gpu_memory_gb") or info.get("gpu_memory_gb", 0)) if gpus else 0,
            interface=str(h.data.get("m3_interface") or ""),
            weights_dir=s["m3_hf_cache"] if gpus or (mock_mb and is_worker) else "",
            weights_gb=int(cat["variants"][variant]["disk_gb"]) if gpus else -(-mock_mb // 1024) if mock_mb and
            is_worker else 0,
            shm_min_gb=16 if gpus else 0,
            needs_rdma=bool(is_worker and span > 1 and gpus),
            services=tuple(services[h.name]), data=data))

    recorded = tuple(sorted((k, _jsonable(s[k])) for k in settings.CLUSTER_KEYS if k in s)) + (
        ("m3_features_effective", list(features)),)
    return ClusterPlan(
        name=name, platform=platform, variant=variant, parallel=str(s["m3_parallel"]), engine=engine,
        serving=serving, features=features, model_id=model_id, served_model_name=served,
        max_model_len=s["m3_max_model_len"], state=str(s["m3_state"]), hosts=tuple(host_plans),
        workers=tuple(worker_plans), endpoint=endpoint, etcd_endpoints=etcd_url, nats_server=nats_url,
        dynamo_version=str(s["m3_dynamo_version"]) if (serving == "dynamo") else "",
        venv=venv if serving == "dynamo" else "", model_dir=model_dir, model_repos=model_repos, settings=recorded)


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


def _dynamo_env(a: str, etcd: str, nats: str, home: str, auth: bool) -> list[tuple[str, str]]:
    env = [("HOME", home), ("ETCD_ENDPOINTS", etcd)]
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
    ctx = {"address": a, "frontend_port": s["m3_frontend_port"], "serving": "dynamo"}
    r = recipes.resolve(ctx, target="frontend")
    # its own host's NATS as the seed (every control host runs one); workers seed from the first control host
    env = dict(_dynamo_env(a, etcd, nats_seed(a), f"{home}/m3-frontend", bool(s["m3_auth"])))
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


def _worker_service(c: _Common, rk: _Rank) -> Service:
    s, mode, size, ep, features, served, model_id = c.s, c.mode, c.size, c.ep, c.features, c.served, c.model_id
    idx, rank, nnodes, slot, host, address = rk.idx, rk.rank, rk.nnodes, rk.slot, rk.host, rk.address
    master, rank0_host, devices, venv, model_dir, home = rk.master, rk.rank0_host, rk.devices, c.venv, c.model_dir, c.home
    etcd, nats = c.etcd, c.nats
    platform = str(settings.get(host.data, "m3_platform"))
    info = catalog.platform(platform)
    engine, serving = s["m3_engine"], s["m3_serving"]
    kv_port = int(s["m3_kv_events_port"]) + slot
    sys_port = int(s["m3_system_port"]) + slot
    http_port = int(s["m3_worker_port"]) + slot
    sizes = sorted(set(int(x) for x in s["m3_cudagraph_capture_sizes"]) | {256, 512, 1024, 2048})
    ctx = {
        "engine": engine, "serving": serving, "runtime": s["m3_runtime"], "vendor": info["vendor"], "generation": info["generation"],
        "platform": platform, "variant": s["m3_variant"], "parallel": str(s["m3_parallel"]), "ep": ep,
        "dp_mode": mode == "dp", "multi_host": nnodes > 1, "features": features,
        "tp": size, "dp": size, "address": address, "address_url_host": url_host(address), "kv_events_port": kv_port,
        "device_ids": ",".join(str(d) for d in devices), "max_model_len": s["m3_max_model_len"],
        "max_num_seqs": s["m3_max_num_seqs"], "cudagraph_capture_sizes": json.dumps(sizes, separators=(",", ":")),
    }
    r = recipes.resolve(ctx, target="worker")
    CL, PL = "cluster", "m3deploy/core/build.py"
    src = f"group_data ({host.name})"
    # cluster overrides: the last layer
    if s["m3_image"]:
        r.image = s["m3_image"]
        r.provenance["image"] = (r.image, f"{CL}:m3_image", src)
    rules = catalog.engines()[engine]
    fill = {"model_id": model_id, "served": served, "model_dir": model_dir, "venv": venv, "address": address,
            "http_port": http_port, "nnodes": nnodes, "rank": rank, "master": master,
            "master_url_host": url_host(master), "master_port": s["m3_master_port"]}
    if s["m3_max_model_len"]:
        r.set_arg(catalog.by_serving(rules["max_model_len"], serving), str(s["m3_max_model_len"]),
                  f"{CL}:m3_max_model_len", src)
    if engine == "mocker":
        r.set_arg("--speedup-ratio", str(s["m3_mocker_speedup_ratio"]), f"{CL}:m3_mocker_speedup_ratio", src)
        if s["m3_runtime"] == "docker":  # the staged mock repos, named as a GPU worker names its repos
            fill["model_dir"] = model_id
            r.set_arg("--speculative-config", simengine.draft_config(), "plan:sim-docker", PL)
        if s["m3_mocker_startup_time"]:
            r.set_arg("--startup-time", str(s["m3_mocker_startup_time"]), f"{CL}:m3_mocker_startup_time", src)
        if s["m3_mocker_engine_type"] != "vllm":  # dynamo/mocker/args.py: vllm unless told
            r.set_arg("--engine-type", s["m3_mocker_engine_type"], f"{CL}:m3_mocker_engine_type", src)
    for key in s["m3_unset_args"] or ():
        r.unset(str(key), f"{CL}:m3_unset_args", src)
    for flag, value in recipes.parse_arg_list(s["m3_extra_args"] or []):
        r.set_arg(flag, value, f"{CL}:m3_extra_args", src)
    for k, v in dict(host.data.get("m3_rdma_env") or {}).items():
        r.set_env(k, v, f"{CL}:m3_rdma_env", src)
    for k, v in (s["m3_extra_env"] or {}).items():
        r.set_env(k, v, f"{CL}:m3_extra_env", src)

    plan_env: list[tuple[str, str]] = []
    head: tuple[str, ...]
    ports = []
    readiness: Readiness
    timeout = int(s["m3_readiness_timeout_s"] or r.readiness_timeout_s)
    if engine == "mocker":
        timeout += int(s["m3_mocker_startup_time"] or 0)
    # mocker workers run in the stand-in engine image with m3_runtime=docker (m3_image overrides it)
    sim_image = engine == "mocker" and s["m3_runtime"] == "docker"
    image = (r.image or simengine.sim_image(str(s["m3_dynamo_version"]))) if sim_image else \
        (r.image if engine != "mocker" else None)
    if serving == "dynamo":
        whome = f"{home}/m3-worker@{slot}" if engine == "mocker" and not image else "/root"
        plan_env += _dynamo_env(address, etcd, nats, whome, bool(s["m3_auth"]))
        plan_env += [("DYN_SYSTEM_PORT", str(sys_port)),
                     ("DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS", '["generate"]')]
        ports.append(Port("system", sys_port, address))
        if rules.get("kv_events"):
            ports.append(Port("kv-events", kv_port, address))
        readiness = Readiness(kind="http", url=f"http://{url_host(address)}:{sys_port}/health", timeout_s=timeout)
    else:
        ports.append(Port("http", http_port, address))
        readiness = Readiness(kind="http", url=f"http://{url_host(address)}:{http_port}/health", timeout_s=timeout)
    plan_env.append(("HF_HUB_OFFLINE", "1"))
    if engine != "mocker":
        if nnodes > 1 and host.data.get("m3_interface"):
            plan_env += [("NCCL_SOCKET_IFNAME", str(host.data["m3_interface"])),
                         ("GLOO_SOCKET_IFNAME", str(host.data["m3_interface"]))]
        if info["vendor"] == "amd" and len(devices) < layout.gpus_per_host(host.data):
            plan_env.append(("HIP_VISIBLE_DEVICES", ",".join(map(str, devices))))
    for k, v in plan_env:
        if k not in r.env:
            r.set_env(k, v, "plan", PL)
    # multi-host ranks: rank 0 first; ranks > 0 headless and only process-alive readiness
    if nnodes > 1:
        multi = rules.get("multi_host") or {}
        for flag, value in {**multi.get("all", {}), **(multi.get("followers", {}) if rank > 0 else {})}.items():
            r.set_arg(flag, _fill(value, fill), "plan:multi-host", PL)
        if rank > 0:
            readiness = Readiness(kind="process", timeout_s=timeout)
            ports = [p for p in ports if p.name not in rules.get("followers_without", ())]

    head = tuple(_fill(tok, fill) for tok in rules["launch"][serving])
    if serving != "dynamo":
        extra = dict(rules.get("standalone_args") or {})
        if rules.get("served_name_flag") and served != model_id:
            extra[rules["served_name_flag"]] = "{served}"
        for flag, value in extra.items():
            r.set_arg(flag, _fill(value, fill), "plan", PL)

    docker: list[str] = []
    if image:
        docker = list(r.docker)
        if info["vendor"] == "nvidia":
            gpus_total = layout.gpus_per_host(host.data)
            sel = "all" if len(devices) >= gpus_total else '"device=' + ",".join(map(str, devices)) + '"'
            docker += ["--gpus", sel]
        docker += ["-v", f"{s['m3_hf_cache']}:/root/.cache/huggingface"]
    base_image = None
    files: tuple[tuple[str, str], ...] = ()
    engine_file = rules.get("engine_file") if serving == "dynamo" else None
    if engine_file:  # TensorRT-LLM's engine YAML: a host file the worker names (and the container mounts)
        path = engine_file["path"].format(slot=slot)
        r.set_arg(engine_file["flag"], path, "plan:engine-file", "m3deploy/core/data/engines.yaml")
        files = ((path, yaml.safe_dump(engine_file["options"], sort_keys=True)),)
        if image:
            docker += ["-v", f"{path}:{path}:ro"]
    bundled = str((rules.get("images") or {}).get(image or "", {}).get("dynamo", "")) == str(s["m3_dynamo_version"])
    if image and serving == "dynamo" and not sim_image and not bundled:  # the stand-in holds the Dynamo venv already
        # Dynamo runs inside the engine image: the images role builds this image on the host, offline, FROM the
        # engine image plus the shipped ai-dynamo wheels (the GB200 lane pip-installs ai-dynamo into vLLM's image).
        base_image = image
        tag = hashlib.sha256(image.encode()).hexdigest()[:12]
        image = f"m3deploy/dynamo-{engine}:{s['m3_dynamo_version']}-{tag}"
    name = f"m3-worker@{slot}"
    # the engine's own HTTP server checks the key (rank 0 serves; headless ranks have no API server)
    api_key_env = ((rules["api_key_env"], API_KEY_SECRET),) if (
        serving != "dynamo" and rank == 0 and s["m3_api_key_file"] and rules.get("api_key_env")) else ()
    return Service(
        name=name, kind="worker", host=host.name, argv=head + tuple(r.argv()), env=tuple(r.env.items()),
        secret_env=(DYN_SECRET_ENV if (serving == "dynamo" and s["m3_auth"]) else ()) + api_key_env,
        image=image, base_image=base_image, docker_args=tuple(docker), ports=tuple(ports), readiness=readiness,
        after=((f"{rank0_host}/m3-worker@{slot}",) if rank > 0 else ()),  # whole hosts: same slot
        env_file=f"/etc/m3/m3-worker@{slot}.env", workdir=f"{home}/m3-worker@{slot}" if engine == "mocker" and not image else "",
        worker=idx, rank=rank, nnodes=nnodes, devices=devices if info["vendor"] in ("nvidia", "amd") else (),
        provenance=r.provenance_records(), files=files)
