"""The component registry: every service kind the plan makes, declared once (issue 33). Pure data, no I/O.

One `Component` per `Service.kind`, in bring-up order: deploy.py calls the roles in the order of their first
component here, stage by stage (`STAGES`), each on the hosts that run one of its kinds; a role deploys its host's
services in plan order. Everything that was a table or a branch elsewhere is a field here, read by
m3deploy/deploy/hostfiles.py (templates, users, masks, scripts, the manifest's packages), deploy.py (the order and
the gates), the roles (install, activate) and tests/unit/test_architecture.py (which roles, and that nothing here is
restated elsewhere). docs/ARCHITECTURE.md "Adding a service" walks through one.

The lifecycle every service role carries out (roles/lifecycle.py): install (the package, its own unit masked first)
-> configure (ship its files: hostfiles) -> activate (`Lifecycle.activate`) -> drain (what a planned stop does) ->
remove (teardown, by the host's manifest).
"""
from __future__ import annotations

from dataclasses import dataclass

from m3deploy.core import internal_tls, monitor, planner, simengine

LIB_DIR = "/usr/local/lib/m3"  # the project's scripts on a host (files/ -> here)
M3_USER = "m3"  # native Dynamo processes (frontend, mocker, planner) run as this system user

# deploy.py's stages, in order: the control plane before the first barrier, the workers between the barriers, the
# planner and monitoring after the serving check
CONTROL, WORKERS, PLANNER, MONITOR = "control plane", "workers", "planner", "monitoring"
STAGES = (CONTROL, WORKERS, PLANNER, MONITOR)

# how its program gets on the host
PACKAGE, VENV, IMAGE, PYTHON3 = "Debian package", "Dynamo venv (roles/artifacts.py)", "container image", "python3"
# what a change of its files does (roles/lifecycle.activate)
RESTART = "restart"  # restart when its files changed this run (or it runs older ones), else make sure it runs
RELOAD = "hitless reload"  # a changed unit restarts it; a changed config, certificate or key list reloads it
DRAINED = "restart, drained at every edge"  # with m3_edge (roles/edge.restart_frontend), else RESTART
ROLLED = "rolled"  # m3_rollout=rolling: only enabled here, restarted in turn by roles/rolling.py; else RESTART
STAGED = "staged"  # Service.standby (m3_planner): installed, never enabled or started; the standby agent runs it
# how the deploy waits for it
POLLED = "its readiness polled from the controller, when this run (re)started it"
REGISTERED = POLLED + "; then the frontend lists it under its running process (or the rollout routes to it)"
HELD = "after the workers: exactly one control host holds the address (roles/vip.wait_vip)"


@dataclass(frozen=True)
class Script:
    """A project file shipped as it is: `source` (files/...) -> `dest` on the host, 0755. `when`: the condition
    (m3deploy.deploy.hostfiles.WHEN) under which a service of the component needs it; shipped once per host, before
    the first unit that runs it (`after_unit`: after it). `restarts`: a change restarts the services that run it."""
    source: str
    dest: str
    when: str = "always"
    after_unit: bool = False
    restarts: bool = True


ETCD_AUTH = Script("files/m3-etcd-auth.py", f"{LIB_DIR}/m3-etcd-auth.py", when="etcd auth")
WATCHDOG = Script("files/m3-watchdog.py", f"{LIB_DIR}/m3-watchdog.py", when="watchdog", after_unit=True)
UNREGISTER_DEAD = Script("files/m3-unregister-dead.py", f"{LIB_DIR}/m3-unregister-dead.py", when="unregisters dead",
                         restarts=False)  # read by the units' ExecStopPost
SIM_ENGINE = Script("files/m3-sim-engine.py", simengine.SIM_ENGINE, when="sim engine")
TLS_LAUNCHER = Script("files/m3-tls-env", internal_tls.LAUNCHER, when="tls")  # m3_internal_tls's ExecStart prefix
NATS_EXPORTER = Script("files/m3-nats-exporter.py", monitor.NATS_EXPORTER_SCRIPT)
ACTUATOR = Script(*planner.SCRIPTS["actuator"])
STANDBY_AGENT = Script(*planner.SCRIPTS["standby-agent"])


@dataclass(frozen=True)
class Lifecycle:
    install: str = PACKAGE  # PACKAGE | VENV | IMAGE | PYTHON3 (a VENV one with a Service.image runs that instead)
    activate: str = RESTART  # RESTART | RELOAD | DRAINED | ROLLED
    standby: str = ""  # STAGED: what a Service.standby one gets instead
    keep_previous: bool = False  # its replaced unit and env file kept in /var/lib/m3/rollback (roles/lifecycle)
    tracked: bool = True  # its (re)starts count for started_anything(): the serving check and the record follow
    drain: str = "SIGTERM, TimeoutStopSec bounds it"  # what a planned stop does
    remove: str = "teardown: unit stopped, files removed, package purged (the host's manifest)"


@dataclass(frozen=True)
class Component:
    kind: str  # Service.kind
    role: str  # roles.<module>.<@deploy function> that carries it out
    stage: str  # one of STAGES
    template: str  # its unit's template in templates/
    lifecycle: Lifecycle = Lifecycle()
    packages: tuple[str, ...] = ()  # installed by its role, purged by teardown
    package_unit: str = ""  # the package's own unit, masked before the install (its postinst would start it)
    user: str = ""  # its unit's User=; "" = root for a container (docker), else M3_USER
    scripts: tuple[Script, ...] = ()  # in shipping order
    unit_vars: tuple[str, ...] = ()  # what else its template takes (hostfiles.UNIT_VARS)
    description: str = ""  # its unit's Description=, where the template takes it
    files: str = ""  # the module that makes all of its host files, mask included ("" = hostfiles' own)
    config: str = ""  # a config file hostfiles renders for it, before its unit (hostfiles.CONFIGS)
    config_check: tuple[str, str] = ()  # (what, command): its config checked before the restart a change causes
    restart_s: int = 2  # RestartSec
    watchdog: bool = False  # a companion unit restarts it when its /live hangs (files/m3-watchdog.py)
    loads_model: bool = False  # runs the engine: the mocker's model directory is its cache
    ready: str = POLLED  # how the deploy waits for it
    checks: tuple[str, ...] = ()  # the verify checks (id prefixes) that cover it (m3deploy/check/verify)


_HOST = ("unit", "port", "file")  # verify's per-service checks over SSH
_DYNAMO = ("launch",)  # a Dynamo client of etcd/NATS: with m3_internal_tls its ExecStart starts with TLS_LAUNCHER
_MONITOR_UNIT = ("description", "package_unit")

COMPONENTS: tuple[Component, ...] = (
    Component("etcd", "roles.etcd.deploy_etcd", CONTROL, "etcd.service.j2", packages=("etcd-server",), user="etcd",
              scripts=(ETCD_AUTH,), unit_vars=("auth_script",), checks=(*_HOST, "health", "secrets", "tls/etcd")),
    Component("nats", "roles.nats.deploy_nats", CONTROL, "nats.service.j2", packages=("nats-server",),
              package_unit="nats-server.service", user="nats", config="nats.conf",
              checks=(*_HOST, "health", "secrets", "tls/nats")),
    Component("frontend", "roles.frontend.deploy_frontend", CONTROL, "m3-frontend.service.j2",
              Lifecycle(VENV, DRAINED, drain="SIGTERM; with m3_edge first drained at every edge (runtime API)"),
              scripts=(TLS_LAUNCHER, WATCHDOG), unit_vars=_DYNAMO, restart_s=1, watchdog=True,
              checks=(*_HOST, "health", "instances", "smoke", "edge/backends")),
    Component("edge", "roles.edge.deploy_edge", CONTROL, "m3-edge.service.j2", Lifecycle(activate=RELOAD),
              packages=("haproxy",), package_unit="haproxy.service", user="root", files="edgefiles",
              checks=("unit", "port", "health", "edge/tls", "edge/plain-http", "edge/backends", "edge/files")),
    Component("vip", "roles.vip.deploy_vip", CONTROL, "m3-vip.service.j2", packages=("keepalived",),
              package_unit="keepalived.service", user="root", files="vipfiles", ready=HELD,
              checks=("unit", "vip/holder")),
    Component("worker", "roles.workers.deploy_workers", WORKERS, "m3-worker@.service.j2",
              Lifecycle(VENV, ROLLED, standby=STAGED, keep_previous=True,
                        drain="SIGTERM: it unregisters, then finishes its requests (roles/rolling.py, one instance "
                              "at a time)"),
              scripts=(SIM_ENGINE, UNREGISTER_DEAD, TLS_LAUNCHER), unit_vars=("unregister_script", *_DYNAMO),
              restart_s=1, loads_model=True, ready=REGISTERED,
              checks=(*_HOST, "health", "instances", "smoke", "deployed")),
    Component("scripted", "roles.workers.deploy_workers", WORKERS, "m3-worker@.service.j2", Lifecycle(VENV),
              scripts=(SIM_ENGINE, UNREGISTER_DEAD, TLS_LAUNCHER), unit_vars=("unregister_script", *_DYNAMO),
              checks=(*_HOST, "health", "smoke/tool-call")),
    Component("planner", "roles.planner.deploy_planner", PLANNER, "m3-planner.service.j2",
              Lifecycle(VENV, tracked=False), scripts=(TLS_LAUNCHER,), unit_vars=(*_DYNAMO, "description"),
              description="Dynamo planner (environment virtual)", checks=_HOST),
    Component("actuator", "roles.planner.deploy_planner", PLANNER, "m3-planner.service.j2",
              Lifecycle(VENV, tracked=False), scripts=(TLS_LAUNCHER, ACTUATOR), unit_vars=(*_DYNAMO, "description"),
              description="m3deploy planner actuator", checks=_HOST),
    Component("standby-agent", "roles.planner.deploy_planner", PLANNER, "m3-planner.service.j2",
              Lifecycle(PYTHON3, tracked=False), user="root", scripts=(STANDBY_AGENT,), unit_vars=("description",),
              description="m3deploy standby agent", checks=_HOST),
    # the manifest lists the packages in this order (prometheus before its node exporter, as it always did)
    Component("prometheus", "roles.monitor.deploy_monitor", MONITOR, "m3-monitor.service.j2",
              packages=("prometheus",), package_unit="prometheus.service", user="prometheus",
              unit_vars=_MONITOR_UNIT, description="Prometheus", config="prometheus.yml",
              config_check=(f"{monitor.PROMETHEUS_CONF} and its rules (promtool)",
                            f"promtool check config {monitor.PROMETHEUS_CONF}"),
              checks=(*_HOST, "health", "metrics")),
    Component("node-exporter", "roles.monitor.deploy_monitor", MONITOR, "m3-monitor.service.j2",
              packages=("prometheus-node-exporter",), package_unit="prometheus-node-exporter.service",
              user="prometheus", unit_vars=_MONITOR_UNIT, description="Prometheus node exporter",
              checks=(*_HOST, "metrics/targets")),
    Component("nats-exporter", "roles.monitor.deploy_monitor", MONITOR, "m3-monitor.service.j2", Lifecycle(PYTHON3),
              user="nats", scripts=(NATS_EXPORTER,), unit_vars=_MONITOR_UNIT,
              description="NATS exporter (files/m3-nats-exporter.py)", checks=(*_HOST, "metrics/targets")),
    Component("gpu-exporter", "roles.monitor.deploy_monitor", MONITOR, "m3-monitor.service.j2", Lifecycle(IMAGE),
              unit_vars=_MONITOR_UNIT, description="GPU metrics exporter", checks=(*_HOST, "metrics/targets")),
)


def all_components() -> tuple[Component, ...]:
    """The registry (read through here, so a test may extend it with monkeypatch)."""
    return COMPONENTS


def find(kind: str) -> Component | None:
    return next((c for c in all_components() if c.kind == kind), None)


def get(kind: str) -> Component:
    c = find(kind)
    if c is None:
        raise KeyError(f"service kind {kind!r} is not in the component registry (m3deploy/core/components.py)")
    return c


def user(kind: str, image: str | None) -> str:
    """The user a service's unit runs as: its component's, else root for a container (docker), else M3_USER."""
    return get(kind).user or ("root" if image else M3_USER)


def roles(stage: str) -> tuple[str, ...]:
    """The roles of a stage, in the order of their first component."""
    return tuple(dict.fromkeys(c.role for c in all_components() if c.stage == stage))


def kinds(role: str) -> tuple[str, ...]:
    """The kinds a role carries out (it runs on a host that has one of them)."""
    return tuple(c.kind for c in all_components() if c.role == role)


def packages() -> tuple[str, ...]:
    """Every package a role installs (and teardown may purge), in registry order."""
    return tuple(dict.fromkeys(p for c in all_components() for p in c.packages))
