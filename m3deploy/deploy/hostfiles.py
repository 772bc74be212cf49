"""Every file the deploy writes on a host, as pure text: the one owner of that text for the roles (which ship
exactly what `host_files` returns) and for `m3deploy render` (which writes it into a directory for review).

`host_files(cp, hp, secrets)` -> [HostFile], in deploy order: apt's retry setting (`APT_CONF`, before the
host's first apt operation), the host's manifest (`MANIFEST`), then per service the config files its command
names (Service.files: TensorRT-LLM's engine YAML), its 0600 env file and its unit
(etcd, NATS, frontend, workers), nats.conf, the frontend's watchdog unit and script, etcd's auth script, the
workers' script that unregisters a killed process (files/m3-unregister-dead.py), the simulated engines' script
and the nats-server mask (a link to /dev/null).
`secrets=None` masks every secret value (`KEY=<secret: NAME>`): what render writes; the roles pass the
controller's store (m3deploy.controller.secrets).

The manifest (`manifest(cp, hp)`, JSON at /etc/m3/manifest.json, written by the deploy before it changes
anything else) lists what the deploy makes on the host: units to stop, containers, files, directories, caches,
venvs, packages and the system user. Teardown (roles/teardown.py) removes what the host's manifest names and
nothing else; `removal_problem` confines each entry, so a manifest edited on the host cannot widen it.

No pyinfra here: render must run without it, and without any host.
"""
from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

from m3deploy.controller.images import built_here
from m3deploy.core import internal_tls, monitor, planner
from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import PORT_RANGE, teardown_path_problem, unbracketed_urls
from m3deploy.core.model import ClusterPlan, HostPlan, Service
from m3deploy.core.refs import image_problem
from m3deploy.core.simengine import SIM_ENGINE
from m3deploy.deploy import edgefiles, vipfiles
from m3deploy.deploy.hostfile import UNIT_DIR, HostFile, unit_path
from m3deploy.deploy.render import render, secret_names, secret_value, service_env

REPO = Path(__file__).resolve().parents[2]  # the pyinfra project: files/ and templates/ beside roles/
ETC_DIR = "/etc/m3"
LIB_DIR = "/usr/local/lib/m3"
MANIFEST = f"{ETC_DIR}/manifest.json"
MANIFEST_VERSION = 1
MANIFEST_KEYS = ("units", "containers", "images", "files", "links", "dirs", "caches", "venvs", "empty_dirs", "packages",
                 "users")
M3_USER = "m3"  # native Dynamo processes (frontend, mocker) run as this system user
M3_HOME = "/var/lib/m3"
ROLLBACK_DIR = f"{M3_HOME}/rollback"  # a changed worker's previous unit and env file (roles/_units.keep_previous)
AUTH_SCRIPT = f"{LIB_DIR}/m3-etcd-auth.py"
WATCHDOG = f"{LIB_DIR}/m3-watchdog.py"
UNREGISTER_DEAD = f"{LIB_DIR}/m3-unregister-dead.py"  # a worker unit's ExecStopPost: files/m3-unregister-dead.py
APT_CONF = "/etc/apt/apt.conf.d/80m3deploy"  # files/m3-apt.conf: apt's retries without the delay that can hang
WATCHDOG_UNIT = "m3-frontend-watchdog.service"
WATCHDOG_GRACE_S = 15  # the frontend answers /live ~1 s after a start; a restart while etcd is away is harmless
NATS_MASK = f"{UNIT_DIR}/nats-server.service"
WHEELHOUSE_ROOT = "/opt/m3/wheelhouse"
STAMP = ".m3-wheelhouse"  # in a venv artifacts.py built: the digest of the wheelhouse it came from
PACKAGES = {"etcd": "etcd-server", "nats": "nats-server", "edge": "haproxy", "vip": "keepalived",
            **monitor.PACKAGES}
TEMPLATES = {"etcd": "etcd.service.j2", "nats": "nats.service.j2", "frontend": "m3-frontend.service.j2",
             "worker": "m3-worker@.service.j2", "scripted": "m3-worker@.service.j2",
             **{k: "m3-monitor.service.j2" for k in monitor.KINDS},
             **{k: "m3-planner.service.j2" for k in planner.KINDS}}
# created by the etcd-server / nats-server / prometheus(-node-exporter) packages
_USERS = {"etcd": "etcd", "nats": "nats", "nats-exporter": "nats", "prometheus": "prometheus",
          "node-exporter": "prometheus", "standby-agent": "root"}
_M3_UNIT = re.compile(r"^(etcd|nats|nats-server|haproxy|prometheus|prometheus-node-exporter|m3-[A-Za-z0-9@._-]+)"
                      r"\.service$")


# ------------------------------------------------------------------------------------------- per service

def service_user(s: Service) -> str:
    """The user a service's unit runs as: the package's for etcd/NATS, root for containers (docker), else m3."""
    return _USERS.get(s.kind) or ("root" if s.image else M3_USER)


def timeout_start_s(s: Service) -> int:
    # systemd's start timeout only bounds ExecStartPre/notify; readiness is polled separately.
    return (s.readiness.timeout_s if s.readiness else 300) + 30


def stop_timeout_s(s: Service) -> int:
    """The drain bound: how long a graceful stop (SIGTERM: unregister, grace, finish in-flight) may take."""
    return 120 if s.image else 30


def restart_s(s: Service) -> int:
    """RestartSec: the serving processes come back fast (a SIGKILLed worker was routable again in 4-6 s on the
    loaded 2-core testbed, docs/OPERATIONS.md); with StartLimitIntervalSec=0 this also paces a crash loop, which
    systemd then never gives up on."""
    return 1 if s.kind in ("worker", "frontend") else 2


def etcd_auth(s: Service) -> bool:
    return s.kind == "etcd" and any(k == "M3_ETCD_ROOT_PASSWORD" for k, _ in s.secret_env)


def unregisters_dead(s: Service) -> bool:
    """A Dynamo worker (it registers in etcd over the TCP request plane): its unit revokes the records a killed
    process of it left (files/m3-unregister-dead.py)."""
    env = dict(s.env)
    return s.kind in ("worker", "scripted") and "ETCD_ENDPOINTS" in env and "DYN_TCP_RPC_HOST" in env


def has_watchdog(s: Service) -> bool:
    return s.kind == "frontend" and bool(s.readiness) and s.readiness.kind == "http"


def nats_conf_path(s: Service) -> str:
    if "-c" not in s.argv:
        raise M3Error(f"nats on {s.host}: argv {list(s.argv)} has no `-c CONF`")
    return s.argv[s.argv.index("-c") + 1]


def _port(s: Service, name: str):
    p = s.port(name)
    if p is not None:
        return p
    raise M3Error(f"service {s.name} on {s.host} has no port named {name!r} (plan.build must set it)")


def env_file(s: Service, secrets) -> HostFile:
    return HostFile(s.env_file, service_env(s, secrets), mode="0600", secret=bool(s.secret_env))


def unit_file(cp: ClusterPlan, s: Service) -> HostFile:
    extra = {"auth_script": AUTH_SCRIPT if etcd_auth(s) else ""} if s.kind == "etcd" else {}
    if s.kind in ("worker", "scripted"):
        extra["unregister_script"] = UNREGISTER_DEAD if unregisters_dead(s) else ""
    if s.kind in ("frontend", "worker", "scripted", "planner", "actuator"):
        extra["launch"] = internal_tls.launcher(s)  # m3_internal_tls: files/m3-tls-env exports etcd's PEM text
    if s.kind in monitor.KINDS:
        extra.update(_MONITOR_UNITS[s.kind])
    text = render(TEMPLATES[s.kind], cluster=cp.name, service=s, user=service_user(s),
                  timeout_start_s=timeout_start_s(s), stop_timeout_s=stop_timeout_s(s), restart_s=restart_s(s),
                  **extra)
    return HostFile(unit_path(s), text)


def config_files(s: Service, secrets=None) -> list[HostFile]:
    """The config files the service's command names (Service.files: TensorRT-LLM's engine YAML, an MPI world's
    hostfile and ssh configs), then its secret files (Service.secret_files: the MPI world's keys, 0600 root;
    `secrets=None` masks them as `<secret: REF>`)."""
    out = [HostFile(path, text) for path, text in s.files]
    if secrets is not None:
        missing = [n for _, ref in s.secret_files for n in secret_names(ref) if n not in secrets]
        if missing:
            raise M3Error(f"service {s.name} on {s.host} needs secret(s) {missing} that the controller's store does "
                          "not have; run the deploy again so they are generated "
                          "(m3deploy.controller.secrets.ensure_secrets)")
    return out + [HostFile(path, f"<secret: {ref.strip()}>\n" if secrets is None else secret_value(ref, secrets),
                           mode="0600", secret=True, user=file_owner(s, ref), group=file_owner(s, ref))
                  for path, ref in s.secret_files]


def file_owner(s: Service, ref: str) -> str:
    """A secret file is root's, but a TLS file (m3deploy.core.internal_tls) belongs to the user reading it."""
    return internal_tls.owner(s) if internal_tls.is_tls_ref(ref) else "root"


def nats_conf(cp: ClusterPlan, s: Service) -> HostFile:
    """With 3 control hosts the plan gives each NATS node its routes (M3_NATS_ROUTE_<i>, in its env file: with
    auth their URLs carry the route user's password) and a "cluster" port: the conf names the variables."""
    routes = [k for k, _ in s.env + s.secret_env if k.startswith("M3_NATS_ROUTE_")]
    text = render("nats.conf.j2", cluster=cp.name, service=s, client=_port(s, "client"),
                  monitor=_port(s, "monitor"), store_dir=f"{s.workdir}/jetstream",
                  auth=any(k == "NATS_AUTH_PASSWORD" for k, _ in s.secret_env),
                  max_payload=cp.nats.max_payload, routes=routes, cluster_name=cp.nats.cluster_name,
                  cluster_port=_port(s, "cluster") if routes else None, tls=internal_tls.nats_tls(s))
    return HostFile(nats_conf_path(s), text)


def watchdog_unit_name(s: Service) -> str:
    """m3-frontend-watchdog.service for m3-frontend; <name>-watchdog.service for the edge's extra frontends."""
    return WATCHDOG_UNIT if s.name == "m3-frontend" else f"{s.name}-watchdog.service"


def watchdog_unit(cp: ClusterPlan, s: Service) -> HostFile:
    return HostFile(f"{UNIT_DIR}/{watchdog_unit_name(s)}",
                    render("m3-watchdog.service.j2", cluster=cp.name, unit=s.unit, url=s.readiness.url,
                           script=WATCHDOG, grace_s=WATCHDOG_GRACE_S))


def project_file(source: str, dest: str, mode: str = "0755") -> HostFile:
    """A file of the project (files/...) shipped as it is."""
    return HostFile(dest, (REPO / source).read_text(), mode=mode, source=source)


def apt_conf() -> HostFile:
    """apt's retry setting (files/m3-apt.conf says why), on every host before its first apt operation."""
    return project_file("files/m3-apt.conf", APT_CONF, mode="0644")


def auth_script() -> HostFile:
    """ExecStartPost of etcd.service with auth: turns authentication on, creates Dynamo's user."""
    return project_file("files/m3-etcd-auth.py", AUTH_SCRIPT)


def unregister_script() -> HostFile:
    return project_file("files/m3-unregister-dead.py", UNREGISTER_DEAD)


def tls_launcher() -> HostFile:
    """m3_internal_tls: what a Dynamo client's ExecStart starts with (m3deploy.core.internal_tls.launcher)."""
    return project_file("files/m3-tls-env", internal_tls.LAUNCHER)


def watchdog_script() -> HostFile:
    return project_file("files/m3-watchdog.py", WATCHDOG)


def sim_engine() -> HostFile:
    """The testbed's engines (m3deploy.core.simengine)."""
    return project_file("files/m3-sim-engine.py", SIM_ENGINE)


# m3_monitor (m3deploy.core.monitor): the units' descriptions and the Debian units they replace (masked)
_MONITOR_UNITS = {"node-exporter": {"description": "Prometheus node exporter",
                                    "package_unit": "prometheus-node-exporter.service"},
                  "prometheus": {"description": "Prometheus", "package_unit": "prometheus.service"},
                  "nats-exporter": {"description": "NATS exporter (files/m3-nats-exporter.py)", "package_unit": ""},
                  "gpu-exporter": {"description": "GPU metrics exporter", "package_unit": ""}}


def monitor_mask(s: Service) -> HostFile | None:
    """The Debian unit a monitoring service replaces, masked before the package is installed (its postinst would
    start it on all addresses)."""
    unit = _MONITOR_UNITS.get(s.kind, {}).get("package_unit")
    return HostFile(f"{UNIT_DIR}/{unit}", link="/dev/null") if unit else None


def nats_exporter_script() -> HostFile:
    return project_file("files/m3-nats-exporter.py", monitor.NATS_EXPORTER_SCRIPT)


def prometheus_files(cp: ClusterPlan) -> list[HostFile]:
    """prometheus.yml and its rules, from the plan (m3deploy.core.monitor), readable by the prometheus user."""
    return [HostFile(monitor.PROMETHEUS_CONF, monitor.to_yaml(monitor.prometheus_config(cp))),
            HostFile(monitor.PROMETHEUS_RULES, monitor.to_yaml(monitor.rules(cp)))]


def monitor_files(cp: ClusterPlan, s: Service) -> list[HostFile]:
    """A monitoring service's files before its unit: the package unit's mask, the exporter script, the config."""
    mask = monitor_mask(s)
    out = [mask] if mask else []
    if s.kind == "nats-exporter":
        out.append(nats_exporter_script())
    if s.kind == "prometheus":
        out += prometheus_files(cp)
    return out


def nats_mask() -> HostFile:
    """The package's nats-server.service masked: it would bind 0.0.0.0:4222."""
    return HostFile(NATS_MASK, link="/dev/null")


# ------------------------------------------------------------------------------------------- per host

def uses_sim_engine(s: Service) -> bool:
    """Native mocker/scripted engines need the script on the host; in a container the stand-in image holds it."""
    return s.kind in ("worker", "scripted") and SIM_ENGINE in s.argv and not s.image


def _native(hp: HostPlan) -> bool:
    return any(s.kind in ("frontend", "worker") and not s.image for s in hp.services)


def host_text_problem(s: Service) -> str:
    """The choke point under validation: what no host file may carry, whatever the plan built ('' when fine):
    a port outside 1024-65535, an image docker cannot parse, an IPv6 host unbracketed in a URL (`tcp://fd00::1:5200`
    reads as host fd00::1:5200; RFC 3986 3.2.2)."""
    lo, hi = PORT_RANGE
    bad = [f"{p.name} {p.port}" for p in s.ports if not lo <= p.port <= hi]
    if bad:
        return f"port(s) {', '.join(bad)} outside {lo}-{hi}"
    for image in filter(None, (s.image, s.base_image)):
        if image_problem(image):
            return image_problem(image)
    urls = unbracketed_urls([*s.argv, *(v for _, v in s.env)])
    return f"URL(s) {', '.join(urls)} with an unbracketed IPv6 host" if urls else ""


def service_files(cp: ClusterPlan, hp: HostPlan, secrets) -> list[HostFile]:
    """Every file of the host's services, in deploy order (etcd, NATS, frontend, workers)."""
    out: list[HostFile] = []
    for s in hp.services:
        if s.kind == "edge":  # HAProxy in front of the frontends (m3deploy.deploy.edgefiles)
            out += edgefiles.edge_files(cp, s, secrets)
            continue
        if s.kind == "vip":  # keepalived: the cluster's address (m3deploy.deploy.vipfiles)
            out += vipfiles.vip_files(cp, s)
            continue
        if s.kind not in TEMPLATES:
            continue
        why = host_text_problem(s)
        if why:
            raise M3Error(f"refusing to render {s.name} on {hp.name}: {why}. Fix the inventory value it came from "
                          "(m3deploy validate names it)")
        if etcd_auth(s):
            out.append(auth_script())
        if s.kind == "nats":
            out += [nats_mask(), nats_conf(cp, s)]
        if s is next((w for w in hp.services if uses_sim_engine(w)), None):
            out.append(sim_engine())  # once, before the first unit that runs it
        if s is next((w for w in hp.services if unregisters_dead(w)), None):
            out.append(unregister_script())  # once, before the first unit that runs it
        if s is next((w for w in hp.services if internal_tls.launcher(w)), None):
            out.append(tls_launcher())  # once, before the first unit that runs it
        out += monitor_files(cp, s) if s.kind in monitor.KINDS else []
        out += [project_file(*planner.SCRIPTS[s.kind])] if s.kind in planner.SCRIPTS else []
        out += [*config_files(s, secrets)] + [env_file(s, secrets)] * bool(s.env_file) + [unit_file(cp, s)]
        if has_watchdog(s):
            out += [watchdog_script(), watchdog_unit(cp, s)] if s is next(
                w for w in hp.services if has_watchdog(w)) else [watchdog_unit(cp, s)]
    return out


def host_files(cp: ClusterPlan, hp: HostPlan, secrets=None) -> list[HostFile]:
    """Every file the deploy writes on this host: apt's retry setting and the manifest first, then the services'
    files."""
    return [apt_conf(), manifest_file(cp, hp), *service_files(cp, hp, secrets)]


# ------------------------------------------------------------------------------------------- the manifest

def manifest(cp: ClusterPlan, hp: HostPlan) -> dict:
    """What the deploy makes on this host, in the order teardown removes it. Keys:
    units (stopped and disabled), containers (removed), images (m3deploy's own, removed), files and links (rm -f),
    dirs (rm -rf), caches (rm -rf
    unless m3_keep_caches), venvs (removed when they carry m3's stamp; their directory and `empty_dirs` then rmdir'ed
    if empty), packages (purged), users (removed)."""
    svcs = list(reversed(hp.services))
    made = service_files(cp, hp, None)
    files, links = [f.path for f in made if not f.link], [f.path for f in made if f.link]
    units = [watchdog_unit_name(s) for s in svcs if has_watchdog(s)] + [s.unit for s in svcs]
    dirs = [s.workdir for s in svcs if s.workdir]  # etcd's data and JWT keys (etcd_jwt_keys), JetStream, HOMEs
    dirs += [ROLLBACK_DIR] * any(s.kind == "worker" for s in svcs)  # secrets (env files) kept for a roll back
    caches, venvs, empty = [], [], []
    if cp.engine == "mocker" and any(s.kind == "worker" for s in svcs):  # native, or mounted into the stand-in
        caches.append(cp.model_dir)
    if _native(hp) and cp.venv:  # roles/artifacts.py: the wheelhouse and the venv built from it
        venvs.append(cp.venv)
        caches.append(f"{WHEELHOUSE_ROOT}/dynamo-{cp.dynamo_version}" if cp.dynamo_version else "")
        caches.append(WHEELHOUSE_ROOT)
        empty += [posixpath.dirname(cp.venv), posixpath.dirname(WHEELHOUSE_ROOT)]
    if hp.weights_dir:
        caches.append(hp.weights_dir)
    users = [M3_USER] if _native(hp) else []
    if users:
        caches.append(M3_HOME)
    return {"m3deploy_manifest": MANIFEST_VERSION, "cluster": cp.name, "host": hp.name,
            "units": list(dict.fromkeys(units)),
            "containers": [s.container for s in svcs if s.image],
            # the images m3deploy made (the stand-in engine image, Dynamo worker images built on the host); a vendor
            # image stays: the host may share it, and it is tens of GB to fetch again
            "images": list(dict.fromkeys(s.image for s in svcs if s.image and built_here(s.image))),
            "files": list(dict.fromkeys([*files, APT_CONF, MANIFEST])), "links": links,
            "dirs": list(dict.fromkeys([*dirs, ETC_DIR])),
            "caches": list(dict.fromkeys(filter(None, caches))),
            "venvs": venvs, "empty_dirs": list(dict.fromkeys(empty)),
            "packages": [PACKAGES[k] for k in PACKAGES if any(s.kind == k for s in svcs)],
            "users": users}


def manifest_file(cp: ClusterPlan, hp: HostPlan, doc: dict | None = None) -> HostFile:
    """The manifest as the host's file; `doc`: manifest(cp, hp) when the caller has it (it renders every file)."""
    return HostFile(MANIFEST, json.dumps(manifest(cp, hp) if doc is None else doc, indent=2) + "\n")


def read_manifest(text: str, host: str) -> dict:
    """The host's manifest as written by `manifest`, every entry checked by `removal_problem`."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise M3Error(f"host {host}: {MANIFEST} is not JSON ({e}). Fix: remove it to tear down by the plan") from e
    if not isinstance(doc, dict) or doc.get("m3deploy_manifest") != MANIFEST_VERSION:
        raise M3Error(f"host {host}: {MANIFEST} is not an m3deploy manifest (version {MANIFEST_VERSION}). "
                      "Fix: remove it to tear down by the plan")
    if not all(isinstance(doc.get(k, []), list) for k in MANIFEST_KEYS):
        raise M3Error(f"host {host}: {MANIFEST}: every one of {', '.join(MANIFEST_KEYS)} must be a list. "
                      "Fix: remove it to tear down by the plan")
    return checked_manifest(doc, host)


def checked_manifest(doc: dict, host: str) -> dict:
    """Every entry of a manifest (the host's, or the plan's for a host that has none) confined by
    `removal_problem`: teardown removes only what this returns."""
    problems = [f"{key}: {why}" for key in MANIFEST_KEYS
                for entry in doc.get(key, []) for why in [removal_problem(key, entry)] if why]
    if problems:
        raise M3Error(f"host {host}: {MANIFEST} names what m3 did not make, refusing to tear down: "
                      + "; ".join(problems) + ". Fix: remove those entries (or the file, to tear down by the plan)")
    return {k: list(doc.get(k, [])) for k in MANIFEST_KEYS}


def removal_problem(key: str, entry) -> str:
    """Why teardown must not remove this manifest entry ('' when m3 owns it): directories by the rule validation
    applies to the path keys (core.inputs.teardown_path_problem), files there or in m3's fixed places (/etc/m3,
    /usr/local/lib/m3, m3's own unit names), only m3's units, packages and user."""
    if not isinstance(entry, str) or not entry:
        return f"{entry!r} is not a name"
    if key in ("dirs", "caches", "venvs", "empty_dirs"):
        return "" if entry == ETC_DIR else teardown_path_problem(entry)
    if key in ("files", "links"):
        if posixpath.normpath(entry) != entry:
            return f"{entry!r} is not a normalized path"
        parent, name = posixpath.split(entry)
        if parent in (ETC_DIR, LIB_DIR) or entry == APT_CONF or (parent == UNIT_DIR and _M3_UNIT.match(name)):
            return ""
        return teardown_path_problem(entry)
    if key == "units":
        return "" if _M3_UNIT.match(entry) else f"{entry} is not one of m3's units"
    if key == "containers":
        return "" if re.fullmatch(r"m3-[A-Za-z0-9_.-]+", entry) else f"{entry!r} is not one of m3's containers"
    if key == "images":
        return "" if built_here(entry) and not image_problem(entry) else f"{entry!r} is not an image m3deploy built"
    if key == "packages":
        return "" if entry in PACKAGES.values() else f"{entry} is not a package m3 installs"
    if key == "users":
        return "" if entry == M3_USER else f"{entry} is not m3's user"
    return f"unknown key {key}"
