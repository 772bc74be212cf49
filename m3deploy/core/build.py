"""inventory -> ClusterPlan: every decision about the cluster, made once, in pure Python, from data.

`build(inventory)` reads the pyinfra inventory's `m3_*` data, lays workers out over hosts, resolves the
recipe layers for each worker rank, and returns frozen dataclasses (m3deploy.core.model). It validates
everything first (m3deploy.core.validate) and raises ValidationError listing every problem at once.
No pyinfra operations, no I/O besides reading the inventory files.

Every service is built once, by its component, from typed inputs (core.control: etcd, NATS, frontends;
core.worker: worker ranks and the scripted engine; core.edge, core.vip, core.planner, core.monitor: the services
their features add). A feature contributes inputs (a client URL's scheme, a worker's pool, its standby flag, its
rank's MPI world, a frontend's index) that the builders read; it may add services but never edits one already
built, so `m3deploy plan --explain` is true for every value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from m3deploy.core import catalog, control, disagg, edge, layout, monitor, mpi, planner, repos, settings, worker
from m3deploy.core import generation as gen
from m3deploy.core.control import (  # noqa: F401 (the plan's names, imported from here by roles and tests)
    AUTH_USER,
    DYN_SECRET_ENV,
    ETCD_CLIENT,
    ETCD_PEER,
    NATS_CLIENT,
    NATS_CLUSTER,
    NATS_MONITOR,
    etcd_jwt_keys,
    etcd_jwt_option,
    nats_seed,
)
from m3deploy.core.errors import ValidationError
from m3deploy.core.inputs import address_of, url_host
from m3deploy.core.inventory import InvHost, cluster_name, load_inventory
from m3deploy.core.model import ClusterPlan, HostPlan, ModelRepo, Provenance, Service, WorkerPlan
from m3deploy.core.sections import driver_plan, images_plan, nats_plan, rollout_plan, weights_plan
from m3deploy.core.worker import API_KEY_SECRET, CLUSTER_LAYER, PLAN_SOURCE  # noqa: F401 (as above)


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
    """What every service of the cluster shares: the settings, the choices derived from them, and where each
    setting was read (provenance)."""

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
    client: control.ClientInputs  # what every Dynamo client is built from (URLs, auth, m3_internal_tls)
    sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # host -> key -> file or "--data"
    ref: str = ""  # the host the non-cluster settings were read from (the first worker)
    datas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # host -> its own data (host-level keys)
    planner_profile: tuple[tuple[str, str], ...] = ()  # m3_planner with the mocker: its profile files
    pool: str = ""  # m3_disagg: "prefill" | "decode" (core/disagg.py); "" aggregated
    generation: gen.Generation | None = None  # the workers' generation (core/generation.py), decided here

    def where(self, key: str, host: str | None = None) -> str:
        """The file (or `--data`) a setting was read from: the host's own data for a host-level key, else the
        first host that sets a cluster key; `default` when nothing set it."""
        root = key.split(".", 1)[0]
        order = [host] if host else []
        order += [self.ref] if root not in settings.CLUSTER_KEYS else []
        order += list(self.sources)
        for h in order:
            if h and root in self.sources.get(h, {}):
                return _relative(self.sources[h][root])
        return "default (m3deploy/core/settings.py)"

    def note(self, key: str, host: str | None = None) -> str:
        """`key = value (where)`: the setting behind a value, for provenance ("" for no key); `host`: a host-level
        key's host (its own value)."""
        if not key:
            return ""
        root = key.split(".", 1)[0]
        data = self.datas.get(host or "", {})
        if host and root == "m3_address" and root not in data:
            return f"host {host}'s address (m3_address unset: its ssh_hostname, else its name)"
        value = data[root] if root in data else self.s.get(root)
        shown = "" if value is None or "." in key else f" = {value!r}"
        return f"{key}{shown} ({self.where(key, host)})"


def _relative(path: str) -> str:
    if path == "--data" or not os.path.isabs(path):
        return path
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def _build(hosts: list[InvHost], name: str) -> ClusterPlan:
    """The plan, in named steps: the shared settings, the control plane, the workers laid over the hosts, the
    scripted engine and the frontends, the endpoint, the model repos, each host's part."""
    control_hosts = [h for h in hosts if "control" in h.groups]
    workers = [h for h in hosts if "workers" in h.groups]
    ref = workers[0] if workers else hosts[0]
    addr = {h.name: address_of(h) for h in hosts}
    c = _common(ref, hosts, workers, control_hosts, addr)
    s, engine, serving = c.s, c.s["m3_engine"], c.s["m3_serving"]
    services: dict[str, list[Service]] = {h.name: [] for h in hosts}
    if c.etcd:
        members = tuple((x.name, addr[x.name]) for x in control_hosts)
        for x in control_hosts:
            services[x.name] += control.control_services(x.name, addr[x.name], c.home, bool(s["m3_auth"]), members,
                                                         name, c.client.tls)
    first_frontend = (f"{control_hosts[0].name}/m3-frontend",) if serving == "dynamo" and control_hosts else ()
    standby = planner.standby_hosts(s, hosts)
    worker_plans, slots, worker0 = _lay_pools(c, workers, addr, services, first_frontend, standby)
    if catalog.engines()[engine].get("scripted") and serving == "dynamo" and worker0 is not None:  # tool-call engine
        wc, rk = worker0
        services[rk.host.name].append(worker.scripted(wc, rk, int(s["m3_system_port"]) + slots[rk.host.name]))
    if serving == "dynamo":
        endpoint = _frontends(c, control_hosts, addr, services)
    else:
        endpoint = _standalone_endpoint(worker_plans, addr, services)
    if planner.enabled(s):  # the planner and its actuator; the standby hosts' workers were built standby
        worker_plans = planner.services(c, services, worker_plans, hosts, addr)
    monitor.add_services(services, hosts, s, addr)  # m3_monitor: exporters everywhere, Prometheus (core/monitor.py)
    model_repos = _model_repos(c, hosts, services)
    host_plans = [_host_plan(c, h, addr[h.name], services[h.name], _span(c, workers)) for h in hosts]
    recorded = tuple(sorted((k, _jsonable(s[k])) for k in settings.CLUSTER_KEYS if k in s and _recorded(k, s[k]))) + (
        ("m3_features_effective", list(c.features)),)
    # the Dynamo venv (from the hosts' wheelhouse): Dynamo's processes, and an engine's CPU build standalone too
    native_venv = serving == "dynamo" or bool(catalog.cpu_build(engine, s["m3_platform"]))
    return ClusterPlan(
        name=name, platform=settings.get(ref.data, "m3_platform") or "", variant=s["m3_variant"],
        parallel=str(s["m3_parallel"]), engine=engine, serving=serving, features=c.features, model_id=c.model_id,
        served_model_name=c.served, max_model_len=s["m3_max_model_len"], state=str(s["m3_state"]),
        hosts=tuple(host_plans), workers=tuple(worker_plans), endpoint=endpoint, etcd_endpoints=c.etcd,
        nats_server=c.nats, dynamo_version=str(s["m3_dynamo_version"]) if native_venv else "",
        venv=c.venv if native_venv else "", model_dir=c.model_dir, model_repos=model_repos,
        rollout=rollout_plan(s), nats=nats_plan(s, name) if c.nats else None, settings=recorded,
        generation=c.generation if serving == "dynamo" else None)


def _recorded(key: str, value) -> bool:
    """Does the plan record this cluster key (`Key.omit_unset`: only when set to another value than its default)?"""
    k = settings.KEYS[key]
    return not k.omit_unset or bool(value) and value != k.default


def _span(c: _Common, workers: list[InvHost]) -> int:
    """Hosts per worker of the cluster's own parallelism (HostPlan.needs_rdma)."""
    return layout.Layout(c.size, layout.gpus_per_host(workers[0].data) if workers else 1).span


def _common(ref: InvHost, hosts: list[InvHost], workers: list[InvHost], control_hosts: list[InvHost],
            addr: Mapping[str, str]) -> _Common:
    """The settings (cluster keys from any host) and the choices every service shares."""
    s = settings.cluster_settings(ref.data, [h.data for h in workers + control_hosts])
    mode, size, ep = settings.parse_parallel(s["m3_parallel"])
    model_id = s["m3_model_id"] or catalog.catalog()["variants"][s["m3_variant"]]["model_id"]
    state_dir = s["m3_state_dir"]
    tls = s["m3_serving"] == "dynamo" and bool(s.get("m3_internal_tls")) and bool(control_hosts)
    etcd_url = nats_url = ""
    if s["m3_serving"] == "dynamo" and control_hosts:
        # one control host: etcd + NATS on it; 3 (validate.control_count): a 3-member etcd and a 3-node NATS
        # cluster, one member per control host (docs/OPERATIONS.md "HA control plane")
        etcd_url = control.etcd_urls([addr[x.name] for x in control_hosts], tls)
        nats_url = nats_seed(addr[control_hosts[0].name])
    # where each host's keys were set (a plan built from data, not files, has no sources: "the inventory's data")
    sources = {h.name: dict(h.sources) or dict.fromkeys(h.data, "the inventory's data")
               for h in [*workers, *control_hosts, *hosts]}
    order = [h.name for h in [*workers, *control_hosts]]
    sources = {n: sources[n] for n in dict.fromkeys(order + list(sources))}
    ctl_note = "the control hosts' m3_address"
    client = control.ClientInputs(
        etcd=etcd_url, nats=nats_seed(addr[control_hosts[0].name], tls) if nats_url else "", auth=bool(s["m3_auth"]),
        tls=tls, lease_ttl=s.get("m3_etcd_lease_ttl"),
        notes={"ETCD_ENDPOINTS": ctl_note + (" (https: m3_internal_tls)" if tls else ""),
               "NATS_SERVER": "the first control host's m3_address" + (" (tls: m3_internal_tls)" if tls else ""),
               "ETCD_LEASE_TTL": "m3_etcd_lease_ttl"})
    mocker_profile = planner.enabled(s) and s.get("m3_engine") == "mocker"
    return _Common(
        s=s, mode=mode, size=size, ep=ep, features=settings.effective_features(s["m3_features"]), model_id=model_id,
        served=s["m3_served_model_name"] or model_id, etcd=etcd_url, nats=nats_url,
        venv=f"{s['m3_venv_root']}/dynamo-{s['m3_dynamo_version']}",
        model_dir=_model_dir(s, state_dir),
        home=state_dir,  # each native service gets its own writable HOME under it: <state_dir>/<unit name>
        client=client, sources=sources, ref=ref.name, datas={h.name: h.data for h in hosts},
        planner_profile=planner.profile_files(s) if mocker_profile else (), generation=gen.of(s, model_id))


def _model_dir(s: Mapping[str, Any], state_dir: str) -> str:
    """Where the workers read the model: the mock model (simulated engines), an engine's CPU build's tiny model
    (engines.yaml `cpu: model`), else the Hugging Face cache."""
    cpu = catalog.cpu_build(str(s["m3_engine"]), str(s["m3_platform"]))
    if catalog.engines()[s["m3_engine"]].get("simulated") or cpu:
        return f"{state_dir}/models/{cpu['model'] if cpu else 'mock-minimax-m3'}"
    return str(s["m3_hf_cache"])


def _lay_pools(c: _Common, workers: list[InvHost], addr: Mapping[str, str], services: dict[str, list[Service]],
               first_frontend: tuple[str, ...], standby: frozenset[str],
               ) -> tuple[list[WorkerPlan], dict[str, int], tuple[_Common, worker.Rank] | None]:
    """The engine instances over the worker hosts: one layout of the cluster's parallelism, or m3_disagg's pools
    (each its own parallelism and hosts, prefill first; worker indices run on across them). Also worker 0's rank 0,
    with its pool's choices (the scripted engine is built beside it)."""
    gpus = layout.gpus_per_host(workers[0].data) if workers else 1
    if not disagg.enabled(c.s):
        plans, slots, first = _lay_workers(c, layout.Layout(c.size, gpus), workers, addr, services, first_frontend,
                                           standby)
        return plans, slots, first and (c, first)
    plans: list[WorkerPlan] = []
    slots: dict[str, int] = {}
    rank0 = None
    for pool, (mode, size, ep), pool_hosts in disagg.pools(c.s, workers):
        cp = replace(c, mode=mode, size=size, ep=ep, pool=pool)
        got, used, first = _lay_workers(cp, layout.Layout(size, gpus), pool_hosts, addr, services, first_frontend,
                                        standby, start=len(plans))
        plans += got
        slots = {h: max(n, slots.get(h, 0)) for h, n in used.items()}
        rank0 = rank0 or (first and (cp, first))
    return plans, slots, rank0


def _lay_workers(c: _Common, lay: layout.Layout, workers: list[InvHost], addr: Mapping[str, str],
                 services: dict[str, list[Service]], first_frontend: tuple[str, ...], standby: frozenset[str],
                 start: int = 0) -> tuple[list[WorkerPlan], dict[str, int], worker.Rank | None]:
    """Lay engine instances over the worker hosts (core.layout): each rank's service added to its host's;
    returns the workers (indices from `start`), how many slots each host uses, and worker `start`'s rank 0."""
    worker_plans: list[WorkerPlan] = []
    slots: dict[str, int] = {h: 0 for h in addr}
    rank0 = None
    for group in lay.groups(workers):
        for k in range(lay.per_host):
            devices, svc_names, widx = lay.devices(k), [], start + len(worker_plans)
            world = tuple((h.name, addr[h.name], len(devices) or 1) for h in group)
            for rank, h in enumerate(group):
                rk = worker.Rank(
                    idx=widx, rank=rank, nnodes=lay.span, slot=slots[h.name], host=h, address=addr[h.name],
                    master=addr[group[0].name], rank0_host=group[0].name, devices=devices, world=world,
                    after=first_frontend if rank == 0 else (), standby=h.name in standby)
                svc = worker.service(c, rk)
                rank0 = rank0 or rk
                slots[h.name] += 1
                services[h.name].append(svc)
                svc_names.append(f"{h.name}/{svc.name}")
            worker_plans.append(WorkerPlan(index=widx, hosts=tuple(g.name for g in group),
                                           tensor_parallel=c.size if c.mode == "tp" else 1,
                                           data_parallel=c.size if c.mode == "dp" else 1,
                                           gpus_per_rank=len(devices), services=tuple(svc_names)))
    return worker_plans, slots, rank0


def _frontends(c: _Common, control_hosts: list[InvHost], addr: Mapping[str, str],
               services: dict[str, list[Service]]) -> str:
    """The Dynamo frontends on every control host, after its control plane (m3_edge: m3_edge_frontends of them,
    and the edge in front). Returns the endpoint: the first control host's frontend, or the edge's."""
    for x in control_hosts:
        services[x.name] += [control.frontend_service(c, x.name, addr[x.name], i)
                             for i in range(edge.frontend_count(c.s))]
    if not control_hosts:
        return ""
    if edge.enabled(c.s):  # HAProxy in front of the frontends: the endpoint is the edge's (core/edge.py)
        return edge.add_services(services, [x.name for x in control_hosts], addr, c.s)
    return f"http://{url_host(addr[control_hosts[0].name])}:{c.s['m3_frontend_port']}/v1"


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
                              and not catalog.cpu_build(c.s["m3_engine"], c.s["m3_platform"])  # the tiny model
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


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v
