"""Shared steps of the service roles (private), one lifecycle for each service: install (its package, the
package's own unit masked first: `install`) -> configure (ship its files: `ship`, `install_service`, `changes`)
-> activate (restart exactly when its files changed, else make sure it runs: `activate`), then wait for
readiness from the controller (`wait_ready`). No decisions about flags here: everything comes from the plan's
Service objects."""
from __future__ import annotations

import functools
import hashlib
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import FactBase, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.operations import apt, python, server, systemd
from pyinfra.operations.util import any_changed

from m3deploy.check import readiness as _readiness
from m3deploy.controller.secrets import KNOWN, api_key, ensure_secrets
from m3deploy.core.build import API_KEY_SECRET
from m3deploy.core.internal_tls import is_tls_ref
from m3deploy.core.model import ClusterPlan, HostPlan, Service
from m3deploy.deploy import hostfiles
from m3deploy.deploy.hostfiles import (  # noqa: F401 (roles use them)
    M3_HOME,
    M3_USER,
    UNIT_DIR,
    HostFile,
    restart_s,
    stop_timeout_s,
    timeout_start_s,
    unit_path,
)
from m3deploy.deploy.render import secret_names

REPO = Path(__file__).resolve().parent.parent


def plans() -> tuple[ClusterPlan, HostPlan]:
    from m3deploy.deploy import context  # the lead's module; imported late so roles import without it
    return context.cluster_plan(), context.host_plan()


@functools.lru_cache(maxsize=None)
def _secrets(cluster: str, extra: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(ensure_secrets(cluster, names=tuple(KNOWN) + extra).items()))


def secrets_for(cp: ClusterPlan) -> dict[str, str]:
    """The generated secrets of the cluster (with the on-demand ones its services' secret files name: an MPI
    world's SSH keys), its API key (m3_api_key_file) when it has one, and the edge's."""
    extra = sorted({n for h in cp.hosts for s in h.services for _, ref in s.secret_files for n in secret_names(ref)
                    if not is_tls_ref(ref)})
    out = dict(_secrets(cp.name, tuple(extra)))
    out.update(_tls_secrets(cp))  # m3_internal_tls: the CA, each host's certificates and keys (controller.tls)
    key = api_key(cp)
    if key:
        out[API_KEY_SECRET] = key
    if cp.endpoint.startswith("https://"):  # the edge's TLS material and the hashes of every valid key
        out.update(_edge_secrets(cp))
    return out


_TLS: dict[tuple, dict[str, str]] = {}  # (cluster, its TLS files) -> certificates: signed once per run


def _tls_secrets(cp: ClusterPlan) -> dict[str, str]:
    from m3deploy.controller import tls

    refs = tuple(sorted({(h.name, h.address, r) for h in cp.hosts for s in h.services for _, r in s.secret_files
                         if is_tls_ref(r)}))
    if refs and (cp.name, refs) not in _TLS:
        _TLS[(cp.name, refs)] = tls.cluster_certs(cp)
    return _TLS.get((cp.name, refs), {})


def _edge_secrets(cp: ClusterPlan) -> dict[str, str]:
    from m3deploy.controller import secrets, tls
    from m3deploy.core import edge

    return {edge.TLS_SECRET: tls.edge_pem(cp), edge.KEYS_SECRET: edge.key_hashes(secrets.api_keys(cp))}


def services(hp: HostPlan, kind: str) -> list[Service]:
    return [s for s in hp.services if s.kind == kind]


class PathState(FactBase):
    """`<mode>:<user>:<group>:<sha256>` of a file, `dir:<mode>:<user>:<group>` of a directory, `-` if absent,
    `user:<uid>` for `user:NAME` — one command where pyinfra's own ops need two or three facts."""

    @staticmethod
    def default():
        return "-"

    def command(self, path):
        if path.startswith("user:"):
            return f"id -u {shlex.quote(path[5:])} 2>/dev/null | sed 's/^/user:/' || echo -"
        q = shlex.quote(path)
        return (f"if [ -d {q} ]; then stat -c 'dir:%a:%U:%G' {q}; "
                f"elif [ -f {q} ]; then printf '%s:' \"$(stat -c '%a:%U:%G' {q})\"; sha256sum < {q} | cut -d' ' -f1; "
                "else echo -; fi")

    def process(self, output):
        return (output[0].strip() if output else "") or "-"


def _mode(mode: str) -> str:
    return str(mode).lstrip("0") or "0"


@operation()
def put_text(text: str, dest: str, mode: str = "0644", user: str = "root", group: str = "root"):
    """Write `text` to `dest` with mode/owner, only when any differs. The file is created with its final mode
    before the content is sent, so a 0600 secret is never readable by others, not even for a moment."""
    want = f"{_mode(mode)}:{user}:{group}:{hashlib.sha256(text.encode()).hexdigest()}"
    have = host.get_fact(PathState, path=dest)
    if have == want:
        return
    q = shlex.quote(dest)
    if have.rsplit(":", 1)[-1] != want.rsplit(":", 1)[-1] or have == "-":
        yield (f"mkdir -p {shlex.quote(str(Path(dest).parent))} && touch {q} && chown {user}:{group} {q} && "
               f"chmod {mode} {q}")
        yield FileUploadCommand(StringIO(text), dest)
    yield f"chown {user}:{group} {q} && chmod {mode} {q}"


class DirDigest(FactBase):
    """sha256 over `<name> <sha256>` lines of the named files in a directory ("-" if any is missing)."""

    @staticmethod
    def default():
        return "-"

    def command(self, path, names):
        q = shlex.quote(path)
        return (f"cd {q} 2>/dev/null && sha256sum -- {' '.join(shlex.quote(n) for n in names)} 2>/dev/null "
                "| sha256sum | cut -d' ' -f1 || echo -")

    def process(self, output):
        return (output[0].strip() if output else "") or "-"


def dir_digest(files: dict[str, bytes]) -> str:
    """What DirDigest reports for a directory holding exactly these files' contents."""
    lines = "".join(f"{hashlib.sha256(files[n]).hexdigest()}  {n}\n" for n in files)
    return hashlib.sha256(lines.encode()).hexdigest()


@operation()
def put_dir(src: str, dest: str, names: tuple[str, ...], mode: str = "0644"):
    """Ship the named files of a controller directory, checked with one fact (a digest over all of them)."""
    contents = {n: (Path(src) / n).read_bytes() for n in names}
    if host.get_fact(DirDigest, path=dest, names=tuple(names)) == dir_digest(contents):
        return
    yield f"mkdir -p {shlex.quote(dest)} && chmod 0755 {shlex.quote(dest)}"
    for n in names:
        yield FileUploadCommand(str(Path(src) / n), f"{dest}/{n}")
        yield f"chmod {mode} {shlex.quote(f'{dest}/{n}')}"


@operation()
def ship_wheelhouse(archive: str, dest: str, mode: str = "0755"):
    """A wheelhouse in one transfer: the controller's tar (controller.artifacts.wheelhouse_archive) unpacked into a
    fresh `<dest>.new`, every file checked against its SHA256SUMS, then swapped for `dest` (stale wheels go with the
    old copy). A failed check leaves `dest` as it was and fails the operation."""
    from m3deploy.controller.artifacts import MANIFEST

    d, new, tar = (shlex.quote(p) for p in (dest, f"{dest}.new", f"{dest}.tar"))
    yield f"mkdir -p {shlex.quote(str(Path(dest).parent))} && rm -rf {new} {tar}"
    yield FileUploadCommand(archive, f"{dest}.tar")
    yield (f"install -d -m {mode} -o root -g root {new} && tar -xf {tar} -C {new} --no-same-owner && rm -f {tar} "
           f"&& (cd {new} && sha256sum --quiet --strict -c {MANIFEST}) && rm -rf {d} && mv {new} {d}")


class UnitState(FactBase):
    """`<active> <enabled>` of a systemd unit, in one command."""

    @staticmethod
    def default():
        return "unknown unknown"

    def command(self, unit):
        u_ = shlex.quote(unit)
        return f"echo $(systemctl is-active {u_} 2>/dev/null; systemctl is-enabled {u_} 2>/dev/null) | cut -c1-80"

    def process(self, output):
        return (output[0].strip() if output else "") or "unknown unknown"


@operation()
def ensure_started(unit: str):
    """The unit active and enabled (one fact; pyinfra's systemd.service needs two)."""
    state_ = host.get_fact(UnitState, unit=unit).split()
    active, enabled = (state_ + ["", ""])[:2]
    if enabled != "enabled":
        yield f"systemctl enable {shlex.quote(unit)}"
    if active != "active":
        yield f"systemctl start {shlex.quote(unit)}"


@operation()
def ensure_dir(path: str, mode: str = "0755", user: str = "root", group: str = "root"):
    """A directory with this mode and owner (one fact)."""
    if host.get_fact(PathState, path=path) == f"dir:{_mode(mode)}:{user}:{group}":
        return
    q = shlex.quote(path)
    yield f"mkdir -p {q} && chown {user}:{group} {q} && chmod {mode} {q}"


@operation()
def ensure_system_user(user: str, home: str):
    """A system user and group without login or home directory creation (one fact)."""
    if host.get_fact(PathState, path=f"user:{user}") != "-":
        return
    u_ = shlex.quote(user)
    yield (f"getent group {u_} >/dev/null || groupadd --system {u_}; "
           f"useradd --system --gid {u_} --home-dir {shlex.quote(home)} --no-create-home "
           f"--shell /usr/sbin/nologin {u_}")


# An apt install that fetches from the mirror is tried again, after a pause, when it fails: a mirror (or the proxy in
# front of it) that drops connections answers every one of apt's own immediate retries alike (seen on the testbed:
# "503 Connection closed" for docker.io on one host of three, twice in a cold run). pyinfra's own op retries.
APT_RETRIES = {"_retries": 2, "_retry_delay": 20}


def install(package: str = "", mask: HostFile | None = None, mask_name: str = ""):
    """Install: a service's Debian package, after its own unit is stopped and masked when `mask` (the package's
    postinst would otherwise start it on every address before our unit exists)."""
    if mask is not None:
        unit = mask.path.rsplit("/", 1)[1]
        systemd.service(name=f"Stop the package's {unit}", service=unit, running=False, enabled=False)
        masked = ship(mask, name=mask_name or f"Mask {unit}")
        systemd.daemon_reload(name=f"Reload systemd ({unit} masked)", _if=masked.did_change)
    if package:
        apt.packages(name=f"Install {package}", packages=[package], no_recommends=True, update=True,
                     cache_time=3600, **APT_RETRIES)


def ensure_m3_user():
    ensure_system_user(name=f"Ensure system user {M3_USER}", user=M3_USER, home=M3_HOME)
    ensure_dir(name=f"Ensure {M3_HOME}", path=M3_HOME, user="root", group="root", mode="0755")


def ensure_workdir(s: Service, user: str):
    if s.workdir:
        ensure_dir(name=f"Ensure {s.workdir}", path=s.workdir, user=user, group=user, mode="0750")


def ship(f: HostFile, name: str = ""):
    """Put one of m3deploy.deploy.hostfiles' files on the host, exactly as `m3deploy render` shows it."""
    if f.link:
        from pyinfra.operations import files

        return files.link(name=name or f"Link {f.path} -> {f.link}", path=f.path, target=f.link)
    return put_text(name=name or f"Render {f.path}", text=f.text, dest=f.path, mode=f.mode, user=f.user,
                    group=f.group)


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


def _did_change(op) -> bool:
    try:
        return op.did_change()
    except RuntimeError:  # not executed on this host
        return False


def started_anything() -> bool:
    """True when this run (re)started any service on any host so far (decided at execution time)."""
    return any(_did_change(op) for op in getattr(state, "_m3_service_ops", ()))


def activate(unit: str, unit_op, changed_ops, *, restart=None, why: str = "its files changed", reload=None,
             rolled: bool = False, tracked: bool = True):
    """Activate: the one restart-when-changed of every service role. daemon-reload when the unit file changed
    (`unit_op`); when any of `changed_ops` changed, restart the unit (`restart(changed)` makes that op instead:
    the edge's drained restart), or with `rolled` only enable it (roles/_rollout.py restarts it in turn, and its
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
        return lambda: _did_change(op)
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
    return lambda: any(_did_change(op) for op in ops)


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


@operation()
def barrier():
    """An operation without commands: pyinfra runs it on every host before any later operation, and it
    never counts as a change."""
    return
    yield  # unreachable: makes this a generator, as pyinfra operations are


def journal_tail(unit: str, lines: int = 40):
    """A logs() callable for readiness: the unit's journal over the pyinfra connection."""
    def fetch() -> str:
        ok, out = host.run_shell_command(
            f"journalctl --no-pager -o short-iso -n {lines} -u {shlex.quote(unit)} 2>&1 || true")
        return "\n".join(out.output_lines) if hasattr(out, "output_lines") else str(out)
    return fetch


def _wait(readiness, what, unit):
    took = _readiness.wait_ready(readiness, what=what, logs=journal_tail(unit))
    host.log(f"{what}: ready in {took:.1f} s")


def wait_ready(s: Service, started=None):
    """Poll the service's readiness from the controller, when this run (re)started it (`started`)."""
    if s.readiness and s.readiness.kind in _readiness.CHECKS:
        python.call(name=f"Wait for {s.unit} ({_readiness.describe(s.readiness)})", function=_wait,
                    readiness=s.readiness, what=f"{s.unit} on {s.host}", unit=s.unit,
                    **({"_if": started} if started is not None else {}))
