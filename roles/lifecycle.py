"""The one lifecycle of every service role, its steps read from the component registry
(m3deploy.core.components): install (its package, the package's own unit masked first: `install`) -> configure
(ship its files: `install_service`, `ship_script`, `changes`) -> activate (restart exactly when its files changed,
else make sure it runs: `activate`; a standby worker only staged: `stage`), then wait for readiness from the
controller (`wait_ready`). No decisions about flags here: everything comes from the plan's Service objects."""
from __future__ import annotations

import hashlib
import shlex

from pyinfra import host, state
from pyinfra.api import FactBase, operation
from pyinfra.operations import apt, python, server, systemd
from pyinfra.operations.util import any_changed

from m3deploy.check import readiness as _readiness
from m3deploy.core import components
from m3deploy.core.components import M3_USER, Script
from m3deploy.core.model import ClusterPlan, HostPlan, Service
from m3deploy.deploy import hostfiles
from m3deploy.deploy.hostfile import package_mask, unit_path
from m3deploy.deploy.hostfiles import M3_HOME
from roles.cluster_secrets import secrets_for
from roles.hostops import APT_RETRIES, PathState, ensure_dir, ensure_started, ensure_system_user, journal_tail, ship


def plans() -> tuple[ClusterPlan, HostPlan]:
    from m3deploy.deploy import context  # the lead's module; imported late so roles import without it
    return context.cluster_plan(), context.host_plan()


def role_services(hp: HostPlan, role_module: str) -> list[Service]:
    """The host's services, in plan order, of the kinds the role in `role_module` carries out (its components'
    `role`, m3deploy.core.components)."""
    kinds = {c.kind for c in components.all_components() if c.role.rsplit(".", 1)[0] == role_module}
    return [s for s in hp.services if s.kind in kinds]


def install(kind: str, mask_name: str = ""):
    """Install, as the component registry says (m3deploy.core.components): the component's Debian package(s), after
    the package's own unit is stopped and masked (its postinst would otherwise start it on every address before our
    unit exists)."""
    packages, mask = components.get(kind).packages, package_mask(kind)
    if mask is not None:
        unit = mask.path.rsplit("/", 1)[1]
        systemd.service(name=f"Stop the package's {unit}", service=unit, running=False, enabled=False)
        masked = ship(mask, name=mask_name or f"Mask {unit}")
        systemd.daemon_reload(name=f"Reload systemd ({unit} masked)", _if=masked.did_change)
    if packages:
        apt.packages(name=f"Install {', '.join(packages)}", packages=list(packages), no_recommends=True, update=True,
                     cache_time=3600, **APT_RETRIES)


def ensure_m3_user():
    ensure_system_user(name=f"Ensure system user {M3_USER}", user=M3_USER, home=M3_HOME)
    ensure_dir(name=f"Ensure {M3_HOME}", path=M3_HOME, user="root", group="root", mode="0755")


def ensure_workdir(s: Service, user: str):
    if s.workdir:
        ensure_dir(name=f"Ensure {s.workdir}", path=s.workdir, user=user, group=user, mode="0750")



def ship_config_files(cp: ClusterPlan, s: Service) -> list:
    """The config files its command names and its secret files (hostfiles.config_files: TLS certificates, an MPI
    world's keys), each its own op: a change restarts it."""
    secrets = secrets_for(cp) if s.secret_files else None
    return [ship(f, name=f"Ship {f.path}") for f in hostfiles.config_files(s, secrets)]


def ship_scripts(s: Service) -> list:
    """The project scripts it runs that are shipped before its unit (hostfiles.scripts), each its own op."""
    return [ship(f, name=f"Ship {f.path}") for f in hostfiles.scripts(s)]


def ship_script(script: Script):
    """One of the components' project scripts (m3deploy.core.components), as hostfiles makes it."""
    return ship(hostfiles.script_file(script), name=f"Ship {script.dest}")


ROLLBACK_DIR = hostfiles.ROLLBACK_DIR


@operation()
def keep_previous(files: dict):
    """Before `files` ({path: new text}) are rewritten: copy each existing one whose content will change to
    ROLLBACK_DIR/<name> (0600 root: an env file holds secrets), so the previous unit and env of a changed
    worker stay on the host (docs/OPERATIONS.md "Roll back"). Nothing to do when nothing changes."""
    for path, text in files.items():
        have = host.get_fact(PathState, path=path)
        if have == "-" or have.rsplit(":", 1)[-1] == hashlib.sha256(text.encode()).hexdigest():
            continue
        q, d = shlex.quote(path), shlex.quote(ROLLBACK_DIR)
        yield f"install -d -m 0700 -o root -g root {d} && install -m 0600 -o root -g root {q} {d}/"


def install_service(cp: ClusterPlan, s: Service, keep: bool = False):
    """Ship the env file (0600 root) and the unit (m3deploy.deploy.hostfiles); return the ops whose change means
    restart. keep: the versions they replace are kept first (keep_previous)."""
    env_f, unit_f = hostfiles.env_file(s, secrets_for(cp)), hostfiles.unit_file(cp, s)
    if keep:
        keep_previous(name=f"Keep the previous {s.unit} and {s.env_file} in {ROLLBACK_DIR}",
                      files={env_f.path: env_f.text, unit_f.path: unit_f.text})
    env_op = ship(env_f)
    unit_op = ship(unit_f)
    return unit_op, env_op


class RunsOlderFiles(FactBase):
    """`stale` when the unit is active but its process started before one of its files was last written (a run
    that wrote them was cut off before it restarted the unit: a host lost mid-deploy, a stopped rollout), else
    `ok`. Seconds resolution: a restart in the same second as the write counts as current."""

    @staticmethod
    def default():
        return "ok"

    def command(self, unit, paths):
        u_, q = shlex.quote(unit), " ".join(shlex.quote(p) for p in paths)
        # one systemctl (a process and a D-Bus call each): ActiveState as `is-active` reads it (active or reloading)
        return (f"s=$(systemctl show --timestamp=unix -p ActiveState -p ExecMainStartTimestamp {u_} 2>/dev/null); t=; "
                'case "$s" in *ActiveState=active*|*ActiveState=reloading*) t=${s#*ExecMainStartTimestamp=}; '
                't=${t%%[!0-9@]*}; t=${t#@};; esac; '
                f"m=$(stat -c %Y {q} 2>/dev/null | sort -n | tail -1); "
                'if [ -n "$t" ] && [ -n "$m" ] && [ "$m" -gt "$t" ]; then echo stale; else echo ok; fi')

    def process(self, output):
        return (output[0].strip() if output else "") or "ok"


@operation()
def runs_current_files(unit: str, paths: tuple[str, ...]):
    """Changes (a no-op command) when the unit runs older files than it has: the restart that follows catches up
    what an interrupted run left, so a re-run converges even though its files are already right."""
    if host.get_fact(RunsOlderFiles, unit=unit, paths=tuple(paths)) == "stale":
        yield f"echo {shlex.quote(unit)} runs older files than its unit and env file: restarting it"


def service_files(s: Service) -> tuple[str, ...]:
    """The files `s` runs from: unit, env file, a config file named with `-c` (nats.conf) and the plan's own
    (TensorRT-LLM's engine YAML, an MPI world's configs and keys)."""
    paths = [unit_path(s)] + ([s.env_file] if s.env_file else [])
    if "-c" in s.argv:
        paths.append(s.argv[s.argv.index("-c") + 1])
    return tuple(dict.fromkeys((*paths, *(p for p, _ in s.files + s.secret_files))))


def changes(s: Service, *ops) -> list:
    """The ops whose change means `s` must restart: `ops` (its files) and the check that it runs them."""
    return [*ops, runs_current_files(name=f"Check {s.unit} runs its current files", unit=s.unit,
                                     paths=service_files(s))]


def did_change(op) -> bool:
    try:
        return op.did_change()
    except RuntimeError:  # not executed on this host
        return False


def started_anything() -> bool:
    """True when this run (re)started any service on any host so far (decided at execution time)."""
    return any(did_change(op) for op in getattr(state, "_m3_service_ops", ()))


def activate(unit: str, unit_op, changed_ops, *, restart=None, why: str = "its files changed", reload=None,
             rolled: bool = False, tracked: bool = True):
    """Activate: the one restart-when-changed of every service role. daemon-reload when the unit file changed
    (`unit_op`); when any of `changed_ops` changed, restart the unit (`restart(changed)` makes that op instead:
    the edge's drained restart), or with `rolled` only enable it (roles/rolling.py restarts it in turn, and its
    op counts for started_anything()); `reload` = (why, ops): reload it when only those changed (hitless); else
    make sure it runs. `tracked`: its (re)starts count for started_anything(). Returns a callable: did this run
    (re)start it? (readiness waits run only then).

    A service none of whose ops will change anything on this host (pyinfra knows at prepare time: an op's commands
    come from the facts, served by one round, m3deploy.deploy.factbatch) gets only its "make sure it runs" op: the
    daemon-reload, restart and reload ops would run no command, and pyinfra's cost of a no-change re-run is per
    operation (benchmarks/results/rerun-*.md)."""
    reloads = tuple(reload[1]) if reload is not None else ()
    if not any(op.will_change for op in (unit_op, *changed_ops, *reloads)):
        op = ensure_started(name=f"Start {unit}", unit=unit)
        if tracked:
            track(op)
        return lambda: did_change(op)
    systemd.daemon_reload(name=f"Reload systemd (unit {unit} changed)", _if=unit_op.did_change)
    changed = any_changed(*changed_ops)
    ops = []
    if rolled:
        systemd.service(name=f"Enable {unit} (the rollout restarts it)", service=unit, running=None,
                        enabled=True, _if=changed)
    elif restart is not None:
        ops.append(restart(changed))
    else:
        ops.append(systemd.service(name=f"Restart {unit} ({why})", service=unit, running=True, restarted=True,
                                   enabled=True, _if=changed))
    if reload is not None:
        reload_why, reloaded = reload[0], any_changed(*reload[1])
        systemd.service(name=f"Reload {unit} ({reload_why})", service=unit, running=True, reloaded=True,
                        _if=lambda: reloaded() and not changed())
    ops.append(ensure_started(name=f"Start {unit}", unit=unit, _if=lambda: not changed()))
    if tracked:
        track(*ops)
    return lambda: any(did_change(op) for op in ops)


def stage(unit: str, unit_op, changed_ops) -> None:
    """Stage, never activate: a standby worker (m3_planner, m3deploy.core.planner) is installed but neither enabled
    nor started by the deploy (the standby agent starts and drains it: files/m3-standby-agent.py). daemon-reload
    when its unit changed; when its files changed while the agent runs it, `systemctl try-restart` (a drained
    restart, only if it runs)."""
    systemd.daemon_reload(name=f"Reload systemd (unit {unit} changed)", _if=unit_op.did_change)
    server.shell(name=f"Restart {unit} if the planner runs it (its files changed)",
                 commands=[f"systemctl try-restart {shlex.quote(unit)}"], _if=any_changed(*changed_ops))


def track(*ops) -> None:
    """Ops that (re)start a service: started_anything() looks at them."""
    if not hasattr(state, "_m3_service_ops"):
        state._m3_service_ops = []
    state._m3_service_ops += ops


def _wait(readiness, what, unit):
    took = _readiness.wait_ready(readiness, what=what, logs=journal_tail(unit))
    host.log(f"{what}: ready in {took:.1f} s")


def wait_ready(s: Service, started=None):
    """Poll the service's readiness from the controller, when this run (re)started it (`started`)."""
    if s.readiness and s.readiness.kind in _readiness.CHECKS:
        python.call(name=f"Wait for {s.unit} ({_readiness.describe(s.readiness)})", function=_wait,
                    readiness=s.readiness, what=f"{s.unit} on {s.host}", unit=s.unit,
                    **({"_if": started} if started is not None else {}))
