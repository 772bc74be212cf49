"""Remove everything the deploy created on this host (the plan's state "absent").

Reads (through m3deploy.deploy.context): cluster_plan() (venv, model_dir, dynamo_version, settings
m3_keep_caches); host_plan().services (units, env files, workdirs, containers), .weights_dir.
Stops and disables every unit, removes containers and the images m3deploy made (`m3deploy/...`: the stand-in
engine image, the Dynamo worker images built on the host; vendor images stay), unit files, env files, /etc/m3, nats.conf, service
workdirs (etcd data, JetStream store, HOMEs), the etcd auth script, the nats-server mask and the
etcd-server/nats-server packages (purged). Caches (wheelhouse, venv, mock model, weights_dir) and the
directories holding them (/var/lib/m3; m3_venv_root and /opt/m3 when nothing else is left in them) are removed
too unless m3_keep_caches is true; with it, only they stay. Every path it deletes is confined to a directory m3
owns (`_safe`, the rule validation applies to the path keys), and in m3_venv_root only the venvs carrying m3's
stamp are removed. The system user m3 is removed. Idempotent.
"""
import shlex
from pathlib import PurePosixPath

from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from m3deploy.controller.images import built_here
from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import teardown_path_problem
from m3deploy.core.simengine import SIM_ENGINE
from roles import _units as u
from roles.artifacts import STAMP, WHEELHOUSE_ROOT
from roles.etcd import AUTH_SCRIPT
from roles.frontend import WATCHDOG, WATCHDOG_UNIT


def _safe(path: str) -> str:
    """The path, if it lies in a directory m3 owns (the rule validation applies to m3_venv_root, m3_hf_cache and
    m3_state_dir, m3deploy.core.inputs): teardown never deletes a system or shared directory."""
    why = teardown_path_problem(path)
    if why:
        raise M3Error(f"refusing to delete {why}")
    return path


def remove_venvs(root: str, *parents: str) -> str:
    """Shell: remove every venv in `root` (m3_venv_root) that artifacts.py made (it holds m3's stamp file), then
    `root` and each of `parents` if nothing else is left in them: a user's files there stay."""
    q = shlex.quote(root)
    rmdirs = "".join(f"rmdir -- {shlex.quote(d)} 2>/dev/null; " for d in (root, *parents))
    return f'for d in {q}/dynamo-*; do if [ -f "$d/{STAMP}" ]; then rm -rf -- "$d"; fi; done; {rmdirs}true'


@deploy("Tear down the MiniMax-M3 stack")
def teardown():
    cp, hp = u.plans()
    keep = bool(dict(cp.settings).get("m3_keep_caches", False))
    svcs = list(reversed(hp.services))
    # One idempotent command: stop/disable every unit that exists, remove containers.
    names = " ".join(shlex.quote(s.unit) for s in svcs)
    containers = " ".join(shlex.quote(s.name.replace("@", "-")) for s in svcs if s.image)
    cmds = [f"for x in {names}; do systemctl disable --now \"$x\" 2>/dev/null || true; done"] if svcs else []
    if containers:
        cmds.append(f"command -v docker >/dev/null && docker rm -f {containers} >/dev/null 2>&1 || true")
        # the images m3deploy made (the stand-in engine image, Dynamo worker images built on the host); a vendor
        # image stays: the host may share it, and it is tens of GB to fetch again
        ours = " ".join(shlex.quote(i) for i in dict.fromkeys(s.image for s in svcs if s.image and built_here(s.image)))
        if ours:
            cmds.append(f"command -v docker >/dev/null && docker image rm -f {ours} >/dev/null 2>&1 || true")
    if cmds:
        server.shell(name="Stop and disable the m3 units", commands=cmds)
    for s in svcs:
        files.file(name=f"Remove {u.unit_path(s)}", path=u.unit_path(s), present=False)
        if s.env_file:
            files.file(name=f"Remove {s.env_file}", path=s.env_file, present=False)
        if s.kind == "nats" and "-c" in s.argv:
            files.file(name="Remove nats.conf", path=s.argv[s.argv.index("-c") + 1], present=False)
        if s.workdir:
            files.directory(name=f"Remove {s.workdir}", path=_safe(s.workdir), present=False)
    kinds = {s.kind for s in svcs}
    if "frontend" in kinds:
        server.shell(name=f"Stop and disable {WATCHDOG_UNIT}",
                     commands=[f"systemctl disable --now {WATCHDOG_UNIT} 2>/dev/null || true"])
        for path in (f"{u.UNIT_DIR}/{WATCHDOG_UNIT}", WATCHDOG):
            files.file(name=f"Remove {path}", path=path, present=False)
    if "etcd" in kinds:
        files.file(name=f"Remove {AUTH_SCRIPT}", path=AUTH_SCRIPT, present=False)
    if any(SIM_ENGINE in s.argv for s in svcs):
        files.file(name=f"Remove {SIM_ENGINE}", path=SIM_ENGINE, present=False)
    if "nats" in kinds:
        files.link(name="Unmask nats-server.service", path="/etc/systemd/system/nats-server.service",
                   present=False)
    systemd.daemon_reload(name="Reload systemd")
    pkgs = [p for k, p in (("etcd", "etcd-server"), ("nats", "nats-server")) if k in kinds]
    if pkgs:
        apt.packages(name=f"Remove {', '.join(pkgs)}", packages=pkgs, present=False, extra_uninstall_args="--purge")
    files.directory(name="Remove /etc/m3", path="/etc/m3", present=False)
    if not keep:
        paths = []
        if any(s.kind in ("frontend", "worker") and not s.image for s in svcs):
            paths += [cp.venv, f"{WHEELHOUSE_ROOT}/dynamo-{cp.dynamo_version}" if cp.dynamo_version else ""]
        if cp.engine == "mocker" and any(s.kind == "worker" for s in svcs):  # native, or mounted into the stand-in
            paths.append(cp.model_dir)
        if hp.weights_dir:
            paths.append(hp.weights_dir)
        if cp.venv:  # every wheelhouse artifacts.py put on the host
            paths.append(WHEELHOUSE_ROOT)
        for p in dict.fromkeys(filter(None, paths)):
            files.directory(name=f"Remove {p}", path=_safe(p), present=False)
        if cp.venv:
            root = str(PurePosixPath(cp.venv).parent)
            server.shell(name=f"Remove m3's venvs in {root}, and the directory if m3 left it empty",
                         commands=[remove_venvs(_safe(root), str(PurePosixPath(WHEELHOUSE_ROOT).parent))])
    if any(not s.image and s.kind in ("frontend", "worker") for s in svcs):
        server.user(name=f"Remove system user {u.M3_USER}", user=u.M3_USER, present=False)
        if not keep:  # with m3_keep_caches the mock model and weights below it stay
            files.directory(name=f"Remove {u.M3_HOME}", path=u.M3_HOME, present=False)
