"""Remove what the deploy made on this host (the plan's state "absent").

What: the host's manifest, /etc/m3/manifest.json, written by the deploy before it changed anything else
(roles/manifest.py; m3deploy.deploy.hostfiles.manifest: `m3deploy render` shows it). Teardown stops and
disables the units it names, removes its containers and the images m3deploy made (`m3deploy/...`: the stand-in
engine image, Dynamo worker images built on the host; vendor images stay), its files, links and directories, purges
its packages, and
removes its caches (wheelhouse, venv, mock model, weights, /var/lib/m3) unless m3_keep_caches is true: in a venv
root only the venvs carrying m3's stamp are removed, then the root and /opt/m3 if nothing else is left in them.
A path the deploy did not make is never deleted: every entry is confined (hostfiles.removal_problem: directories
by the rule validation applies to the path keys, core.inputs.teardown_path_problem; files only in m3's own
places; only m3's units, packages and user), and a manifest naming anything else stops the teardown of that host.
A host without a manifest (deployed before manifests existed) is torn down by the plan as before: the manifest
the current plan would have written. Idempotent: the manifest goes last, with /etc/m3; a second run finds none,
and what the plan names is already gone.

`prune_host` (`m3deploy prune`, prune.py): a host no plan names any more, drained (its worker units stopped one at a
time) and torn down by its manifest alone; refused when it has none. `remove` is also what roles/manifest.py
removes a shrinking plan's leftovers with.

Reads (through m3deploy.deploy.context): cluster_plan() (venv, model_dir, dynamo_version, settings
m3_keep_caches); host_plan() (services, weights_dir) for a host without a manifest.
"""
import shlex
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api import FactBase, deploy
from pyinfra.operations import apt, files, server, systemd

from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import teardown_path_problem
from m3deploy.deploy import hostfiles
from m3deploy.deploy.context import InvalidPlan
from m3deploy.deploy.hostfiles import ETC_DIR, MANIFEST, STAMP
from roles import lifecycle


class DeployManifest(FactBase):
    """The text of the host's /etc/m3/manifest.json ('' when there is none)."""

    @staticmethod
    def default():
        return ""

    def command(self):
        return f"cat {shlex.quote(MANIFEST)} 2>/dev/null || true"

    def process(self, output):
        return "\n".join(output)


def _safe(path: str) -> str:
    """A venv's parent (not itself a manifest entry), if it lies in a directory m3 owns (the rule validation
    applies to m3_venv_root, m3deploy.core.inputs): teardown never empties a system or shared directory."""
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


def host_manifest(cp, hp) -> dict:
    """The host's manifest, checked entry by entry; the plan's (checked the same way) when the host has none."""
    text = host.get_fact(DeployManifest)
    try:
        if text.strip():
            return hostfiles.read_manifest(text, hp.name)
        host.noop(f"no {MANIFEST} on the host (deployed before manifests): tearing down what the plan names")
        return hostfiles.checked_manifest(hostfiles.manifest(cp, hp), hp.name)
    except M3Error as e:  # before any operation: pyinfra prints it without a traceback and exits 2
        raise InvalidPlan(f"teardown refused, nothing was changed:\n{e}") from None


@deploy("Tear down the MiniMax-M3 stack")
def teardown():
    cp, hp = lifecycle.plans()
    remove(host_manifest(cp, hp), keep=bool(cp.setting("m3_keep_caches")))


@deploy("Drain and tear down a pruned host")
def prune_host():
    """`m3deploy prune` (prune.py): a host the inventory no longer names, torn down by its own manifest only
    (no plan names it): its workers drained one at a time first, then everything the manifest names."""
    text = host.get_fact(DeployManifest)
    try:
        if not text.strip():
            raise M3Error(f"host {host.name}: no {MANIFEST} (deployed before manifests, or torn down already): "
                          "prune removes only what a manifest names. Fix: put the host back in the inventory and "
                          "deploy it, or tear it down with the old inventory and --data m3_state=absent")
        m = hostfiles.read_manifest(text, host.name)
    except M3Error as e:
        raise InvalidPlan(f"prune refused, nothing was changed:\n{e}") from None
    for unit in [x for x in m["units"] if x.startswith("m3-worker")]:
        server.shell(name=f"Drain {unit} (SIGTERM: it leaves routing, waits its grace period, finishes its requests)",
                     commands=[f"systemctl stop {shlex.quote(unit)} 2>/dev/null || true"])
    remove(m, keep=False)


def remove(m: dict, keep: bool, final: bool = True):
    """The operations that remove what a checked manifest `m` names (caches and venvs unless `keep`). `final`: the
    whole host's manifest (systemd reloaded, /etc/m3 removed last, with the manifest in it); else a part of one
    (roles/manifest.py: what a shrinking plan left over), and only what it names."""
    # One idempotent command: stop/disable every unit that exists, remove containers.
    cmds = [f"for x in {' '.join(map(shlex.quote, m['units']))}; do systemctl disable --now \"$x\" 2>/dev/null "
            "|| true; done"] if m["units"] else []
    if m["containers"]:
        cmds.append(f"command -v docker >/dev/null && docker rm -f {' '.join(map(shlex.quote, m['containers']))} "
                    ">/dev/null 2>&1 || true")
        if m["images"]:
            cmds.append(f"command -v docker >/dev/null && docker image rm -f {' '.join(map(shlex.quote, m['images']))} "
                        ">/dev/null 2>&1 || true")
    if cmds:
        server.shell(name="Stop and disable the m3 units", commands=cmds)
    for path in m["files"]:
        if path != MANIFEST:  # last: a teardown that stops half-way can run again from it
            files.file(name=f"Remove {path}", path=path, present=False)
    for path in m["links"]:
        files.link(name=f"Remove {path}", path=path, present=False)
    if final or m["units"] or m["files"] or m["links"]:
        systemd.daemon_reload(name="Reload systemd")
    if m["packages"]:
        apt.packages(name=f"Remove {', '.join(m['packages'])}", packages=m["packages"], present=False,
                     extra_uninstall_args="--purge")
    for path in m["dirs"]:
        if path != ETC_DIR:
            files.directory(name=f"Remove {path}", path=path, present=False)
    if not keep:
        for path in dict.fromkeys([*m["venvs"], *m["caches"]]):
            files.directory(name=f"Remove {path}", path=path, present=False)
        for root in dict.fromkeys(str(PurePosixPath(v).parent) for v in m["venvs"]):
            others = [d for d in m["empty_dirs"] if d != root]
            server.shell(name=f"Remove m3's venvs in {root}, and the directory if m3 left it empty",
                         commands=[remove_venvs(_safe(root), *others)])
    for user in m["users"]:
        server.user(name=f"Remove system user {user}", user=user, present=False)
    if final:
        files.directory(name=f"Remove {ETC_DIR}", path=ETC_DIR, present=False)  # with the manifest in it
