"""Every file the deploy writes on a host, as pure text: the one owner of that text for the roles (which ship
exactly what `host_files` returns) and for `m3deploy render` (which writes it into a directory for review).

`host_files(cp, hp, secrets)` -> [HostFile], in deploy order: apt's retry setting (`APT_CONF`, before the
host's first apt operation), the host's manifest (`MANIFEST`), then per service, as its component says
(m3deploy.core.components): its package's own unit masked (a link to /dev/null), the project scripts it runs
(etcd's auth script, the simulated engines', the workers' script that unregisters a killed process, the TLS
launcher, the planner's: each once per host, before the first unit that runs it), its config (nats.conf,
prometheus.yml), the config files its command names (Service.files: TensorRT-LLM's engine YAML), its 0600 env file
and its unit from the component's template, then the frontend's watchdog script and unit; the edge's and the
address's files come whole from m3deploy.deploy.edgefiles and vipfiles.
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
from m3deploy.core import components, internal_tls, monitor
from m3deploy.core.components import LIB_DIR, M3_USER, VENV, Script
from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import PORT_RANGE, teardown_path_problem, unbracketed_urls
from m3deploy.core.model import ClusterPlan, HostPlan, Service
from m3deploy.core.refs import image_problem
from m3deploy.core.simengine import SIM_ENGINE
from m3deploy.deploy import edgefiles, vipfiles
from m3deploy.deploy.hostfile import UNIT_DIR, HostFile, package_mask, unit_path
from m3deploy.deploy.render import render, secret_names, secret_value, service_env

REPO = Path(__file__).resolve().parents[2]  # the pyinfra project: files/ and templates/ beside roles/
ETC_DIR = "/etc/m3"
MANIFEST = f"{ETC_DIR}/manifest.json"
MANIFEST_VERSION = 1
MANIFEST_KEYS = ("units", "containers", "images", "files", "links", "dirs", "caches", "venvs", "empty_dirs", "packages",
                 "users")
M3_HOME = "/var/lib/m3"
ROLLBACK_DIR = f"{M3_HOME}/rollback"  # a changed worker's previous unit and env file (roles/lifecycle.keep_previous)
AUTH_SCRIPT = components.ETCD_AUTH.dest
WATCHDOG = components.WATCHDOG.dest
UNREGISTER_DEAD = components.UNREGISTER_DEAD.dest  # a worker unit's ExecStopPost: files/m3-unregister-dead.py
APT_CONF = "/etc/apt/apt.conf.d/80m3deploy"  # files/m3-apt.conf: apt's retries without the delay that can hang
WATCHDOG_UNIT = "m3-frontend-watchdog.service"
WATCHDOG_GRACE_S = 15  # the frontend answers /live ~1 s after a start; a restart while etcd is away is harmless
WHEELHOUSE_ROOT = "/opt/m3/wheelhouse"
STAMP = ".m3-wheelhouse"  # in a venv artifacts.py built: the digest of the wheelhouse it came from
# m3's own unit names (etcd, nats, m3-*) and the package units it masks (the registry's), as teardown may remove
# them: derived, so every mask a component declares (keepalived.service for m3_vip too) can be torn down
_M3_UNIT = re.compile(r"^(etcd|nats|m3-[A-Za-z0-9@._-]+)\.service$|^("
                      + "|".join(re.escape(c.package_unit) for c in components.all_components() if c.package_unit)
                      + ")$")


# ------------------------------------------------------------------------------------------- per service

def service_user(s: Service) -> str:
    """The user a service's unit runs as (m3deploy.core.components.user: its component's, else root for a
    container, else m3)."""
    return components.user(s.kind, s.image)


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
    return components.get(s.kind).restart_s


def launch(s: Service) -> tuple[str, ...]:
    """What the service's ExecStart starts with: with m3_internal_tls a Dynamo client's TLS launcher and its files
    (files/m3-tls-env), else (). The one place hostfiles asks m3deploy.core.internal_tls for it."""
    return s.launcher


def _etcd_auth(s: Service) -> bool:
    return any(k == "M3_ETCD_ROOT_PASSWORD" for k, _ in s.secret_env)


def _registers(s: Service) -> bool:
    env = dict(s.env)
    return "ETCD_ENDPOINTS" in env and "DYN_TCP_RPC_HOST" in env


def has_watchdog(s: Service) -> bool:
    c = components.find(s.kind)
    return bool(c and c.watchdog) and bool(s.readiness) and s.readiness.kind == "http"


# when a service needs one of its component's scripts (m3deploy.core.components.Script.when)
WHEN = {"always": lambda s: True, "etcd auth": _etcd_auth, "unregisters dead": _registers,
        "sim engine": lambda s: SIM_ENGINE in s.argv and not s.image, "tls": lambda s: bool(launch(s)),
        "watchdog": has_watchdog}


def needs(s: Service, script: Script) -> bool:
    """Does `s` run `script`: its component ships it, and the script's condition holds for `s`."""
    c = components.find(s.kind)
    return c is not None and script in c.scripts and WHEN[script.when](s)


def etcd_auth(s: Service) -> bool:
    """etcd with auth (its first member): files/m3-etcd-auth.py turns it on after the start."""
    return needs(s, components.ETCD_AUTH)


def unregisters_dead(s: Service) -> bool:
    """A Dynamo worker (it registers in etcd over the TCP request plane): its unit revokes the records a killed
    process of it left (files/m3-unregister-dead.py)."""
    return needs(s, components.UNREGISTER_DEAD)


def uses_sim_engine(s: Service) -> bool:
    """Native mocker/scripted engines need the script on the host; in a container the stand-in image holds it."""
    return needs(s, components.SIM_ENGINE)


# what else a component's template takes (m3deploy.core.components `unit_vars`)
UNIT_VARS = {"auth_script": lambda s, c: AUTH_SCRIPT if etcd_auth(s) else "",
             "unregister_script": lambda s, c: UNREGISTER_DEAD if unregisters_dead(s) else "",
             "launch": lambda s, c: launch(s),  # m3_internal_tls: files/m3-tls-env exports etcd's PEM text
             "description": lambda s, c: c.description, "package_unit": lambda s, c: c.package_unit}


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
    c = components.get(s.kind)
    extra = {name: UNIT_VARS[name](s, c) for name in c.unit_vars}
    text = render(c.template, cluster=cp.name, service=s, user=service_user(s),
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
    return components.user(s.kind, s.image) if internal_tls.is_tls_ref(ref) else "root"


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



def script_file(script: Script) -> HostFile:
    """One of the components' project scripts (m3deploy.core.components.Script), as the host gets it."""
    return project_file(script.source, script.dest)


def scripts(s: Service) -> list[HostFile]:
    """The scripts `s` runs that are shipped before its unit, in its component's order."""
    return [script_file(x) for x in components.get(s.kind).scripts if not x.after_unit and needs(s, x)]


def prometheus_files(cp: ClusterPlan) -> list[HostFile]:
    """prometheus.yml and its rules, from the plan (m3deploy.core.monitor), readable by the prometheus user."""
    return [HostFile(monitor.PROMETHEUS_CONF, monitor.to_yaml(monitor.prometheus_config(cp))),
            HostFile(monitor.PROMETHEUS_RULES, monitor.to_yaml(monitor.rules(cp)))]


# the config a component's service gets before its unit (m3deploy.core.components `config`)
CONFIGS = {"nats.conf": lambda cp, s: [nats_conf(cp, s)], "prometheus.yml": lambda cp, s: prometheus_files(cp)}
# the modules that make every file of a component (m3deploy.core.components `files`), its mask first
OWN_FILES = {"edgefiles": lambda cp, s, secrets: edgefiles.edge_files(cp, s, secrets),  # HAProxy (m3_edge)
             "vipfiles": lambda cp, s, secrets: vipfiles.vip_files(cp, s)}  # keepalived: the address (m3_vip)


# ------------------------------------------------------------------------------------------- per host

def _any(svcs, has) -> bool:
    """Does any of `svcs` have a component for which has(component, service) holds."""
    return any(c is not None and has(c, s) for s in svcs for c in [components.find(s.kind)])


def _native(hp: HostPlan) -> bool:
    """A process from the Dynamo venv runs here: the m3 user, the venv and its wheelhouse."""
    return _any(hp.services, lambda c, s: c.lifecycle.install == VENV and not s.image)


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




def _first_needed(s: Service, shipped: set[str], after_unit: bool) -> list[HostFile]:
    """The scripts `s` runs that no earlier unit on the host did (each once per host, before the first unit that
    runs it; `after_unit`: the ones shipped after it), marked as shipped."""
    out = [x for x in components.get(s.kind).scripts if x.after_unit == after_unit and x.dest not in shipped
           and needs(s, x)]
    shipped.update(x.dest for x in out)
    return [script_file(x) for x in out]


def _files_of(cp: ClusterPlan, s: Service, secrets, shipped: set[str]) -> list[HostFile]:
    """One service's files, in deploy order: its package's mask, the scripts it runs, its config, the config files
    its command names, its env file, its unit, then what comes after the unit (the watchdog's script and unit)."""
    c = components.get(s.kind)
    out = [f for f in [package_mask(s.kind)] if f] + _first_needed(s, shipped, after_unit=False)
    out += CONFIGS[c.config](cp, s) if c.config else []
    out += [*config_files(s, secrets)] + [env_file(s, secrets)] * bool(s.env_file) + [unit_file(cp, s)]
    out += _first_needed(s, shipped, after_unit=True)
    return out + [watchdog_unit(cp, s)] * has_watchdog(s)


def service_files(cp: ClusterPlan, hp: HostPlan, secrets) -> list[HostFile]:
    """Every file of the host's services, in deploy order (etcd, NATS, frontend, workers, ...), as each one's
    component says (m3deploy.core.components)."""
    out: list[HostFile] = []
    shipped: set[str] = set()  # the scripts already shipped before an earlier unit
    for s in hp.services:
        c = components.find(s.kind)
        if c is None:
            continue
        if c.files:
            out += OWN_FILES[c.files](cp, s, secrets)
            continue
        why = host_text_problem(s)
        if why:
            raise M3Error(f"refusing to render {s.name} on {hp.name}: {why}. Fix the inventory value it came from "
                          "(m3deploy validate names it)")
        out += _files_of(cp, s, secrets, shipped)
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
    dirs += [ROLLBACK_DIR] * _any(svcs, lambda c, s: c.lifecycle.keep_previous)  # env files (secrets) kept
    caches, venvs, empty = [], [], []
    if cp.engine == "mocker" and _any(svcs, lambda c, s: c.loads_model):  # native, or mounted into the stand-in
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
            "packages": _packages(svcs),
            "users": users}


def _packages(svcs) -> list[str]:
    """The packages of the host's components, in the registry's order."""
    kinds = {s.kind for s in svcs}
    return list(dict.fromkeys(p for c in components.all_components() if c.kind in kinds for p in c.packages))


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
        return "" if entry in components.packages() else f"{entry} is not a package m3 installs"
    if key == "users":
        return "" if entry == M3_USER else f"{entry} is not m3's user"
    return f"unknown key {key}"
