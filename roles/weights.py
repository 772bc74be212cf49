"""Model weights: download every repo the workers load (cluster_plan().model_repos: the target checkpoint, EAGLE3
draft heads, a separate tokenizer) once per host into the HF cache directory the worker containers mount
(host_plan().weights_dir -> /root/.cache/huggingface), resumable, then verified with `hf cache verify` and
checked complete against its safetensors index (m3deploy.check.hfcache); workers then run with
HF_HUB_OFFLINE=1 (set by the plan).

The Hugging Face token comes from the controller (env HF_TOKEN, or the 0600 file named by
m3_hf_token_file), is delivered to the host as a root-only 0600 file and read from there by the
download (HF_TOKEN_PATH): never in argv, op names or logs; removed after the download.

Where each repo comes from is m3_weights_source (docs/WEIGHTS.md):
- hub: every host downloads (below); shared: one shared filesystem, only the first weights host downloads;
- controller: the controller holds each repo once in its HF cache (m3_weights_controller_cache; downloaded with
  huggingface_hub, or mock repos built by m3deploy.controller.mockrepos with m3_mock_repo_mb), checked complete
  against its safetensors index, then fanned out;
- mirror:<host>: that host downloads (below), then fans out.
Fan-out: m3deploy.core.fanout.schedule decides who sends to whom in which round (at most m3_weights_fanout
receivers per holder and round); here every weights host gets one op per round, in which the receivers pull
(rsync over SSH from the sender host, or the controller pushes) under a flock on the receiving host's HF cache,
then check the repo complete against its index and write the marker. pyinfra finishes an op on every host before
the next op, so a round reads only from hosts earlier rounds completed. Transfer credentials: a per-cluster
ed25519 key pair made on the controller (m3deploy.controller.secrets.ensure_transfer_key); the private key goes
to receivers as a root-only 0600 file, the public key into senders' /root/.ssh/authorized_keys as
`restrict,from="<cluster addresses>",command="rrsync -ro <hub>"` (rrsync: Debian's rsync package,
/usr/bin/rrsync); senders are pinned in a known_hosts file made from their host keys (no trust on first use).
Both are removed again after the last round.

Reads host_plan(): weights_dir, weights_gb, services (worker image); cluster_plan(): model_repos, venv,
hosts. Data keys:
- m3_hf_token_file (controller path, must be 0600)
- m3_weights_source, m3_weights_fanout, m3_weights_controller_cache, m3_mock_repo_mb
- m3_weights_download ("image": `hf` inside the worker image via docker; "host": `hf` on the host;
  default "image" when the worker has an image)
- m3_hf_cli (host path of `hf`, default <venv>/bin/hf or `hf`), m3_weights_verify (default True)
"""
from __future__ import annotations

import os
import re
import shlex
import threading
from io import StringIO
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.facts.files import File
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files, server

from m3deploy.check import hfcache
from m3deploy.controller.secrets import require_private
from m3deploy.core import fanout
from m3deploy.core.errors import M3Error, plural
from m3deploy.deploy import context
from roles import hostops

TOKEN_PATH = "/etc/m3/hf_token"
CONTAINER_CACHE = "/root/.cache/huggingface"
CONTAINER_TOKEN = "/run/secrets/hf_token"


def controller_token(hp) -> str | None:
    """HF_TOKEN from the controller's environment, else the plan's weights.token_file (m3_hf_token_file, 0600),
    else None."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"].strip()
    path = hp.weights.token_file
    if not path:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        raise M3Error(f"m3_hf_token_file: {p} does not exist. Fix: write the token there (chmod 600) or set HF_TOKEN")
    require_private(p, f"m3_hf_token_file: {p}")
    return p.read_text().strip() or None


def marker_path(weights_dir: str, model_id: str) -> str:
    return f"{weights_dir.rstrip('/')}/.m3-complete-{re.sub(r'[^A-Za-z0-9._-]+', '--', model_id)}"


@deploy("Model weights")
def deploy_weights():
    hp = context.host_plan()
    cp = context.cluster_plan()
    if not _has_weights(hp) or not cp.model_repos:
        return
    kind, mirror = fanout.parse_source(cp.setting("m3_weights_source"))
    if kind == "shared" and hp.name != _weights_hosts(cp)[0].name:
        return
    if kind in ("hub", "shared") or (kind == "mirror" and hp.name == mirror):
        _download(hp, cp)
    if kind in ("controller", "mirror"):
        _fan_out(hp, cp, fanout.CONTROLLER if kind == "controller" else mirror)


def _has_weights(hp) -> bool:
    return bool(hp.weights_dir) and hp.weights_gb > 0


def _weights_hosts(cp):
    return [h for h in cp.hosts if _has_weights(h)]


def _download(hp, cp):
    """Every repo from the Hugging Face Hub into this host's cache (resumable, verified)."""
    todo = [r for r in cp.model_repos if not host.get_fact(File, path=marker_path(hp.weights_dir, r.repo))]
    if not todo:
        return
    image = next((s.image for s in hp.services if s.kind == "worker" and s.image), "")
    mode = hp.weights.download
    token = controller_token(hp)
    files.directory(name=f"Create {hp.weights_dir}", path=hp.weights_dir, mode="755")
    if token:
        files.directory(name="Create /etc/m3", path="/etc/m3", user="root", group="root", mode="700")
        files.put(name=f"Upload the Hugging Face token to {TOKEN_PATH} (0600)", src=StringIO(token + "\n"),
                  dest=TOKEN_PATH, user="root", group="root", mode="600")
    verify = hp.weights.verify
    if mode == "image":
        if not image:
            raise M3Error(f"host {hp.name}: m3_weights_download is 'image' but no worker on it has an image. "
                          "Fix: set m3_weights_download = 'host'")
        secret = f"-v {TOKEN_PATH}:{CONTAINER_TOKEN}:ro -e HF_TOKEN_PATH={CONTAINER_TOKEN} " if token else ""
        hf = (f"docker run --rm --network=host -v {shlex.quote(hp.weights_dir)}:{CONTAINER_CACHE} {secret}"
              f"--entrypoint hf {shlex.quote(image)}")
    else:
        cli = hp.weights.hf_cli
        hf = (f"HF_HOME={shlex.quote(hp.weights_dir)} " + (f"HF_TOKEN_PATH={TOKEN_PATH} " if token else "")
              + shlex.quote(cli))
    for r in todo:
        model = shlex.quote(r.repo)
        rev = f" --revision {shlex.quote(r.revision)}" if r.revision != "main" else ""
        commands = [f"{hf} download {model}{rev}"]  # resumes partial files; hashes checked on download
        if verify:
            commands.append(f"{hf} cache verify {model}{rev} --fail-on-missing-files")
        # complete against its safetensors index before anything starts with HF_HUB_OFFLINE=1
        commands.append(hfcache.remote_command(f"{hp.weights_dir}/hub", [hfcache.spec(r)]))
        commands.append(f"touch {shlex.quote(marker_path(hp.weights_dir, r.repo))}")
        server.shell(name=f"Download {r.repo} ({r.role}) into {hp.weights_dir} (resumable, verified)",
                     commands=commands)
    if token:
        files.file(name=f"Remove {TOKEN_PATH}", path=TOKEN_PATH, present=False)


# ------------------------------------------------------------------------------------------- fan-out
TRANSFER_KEY = "/etc/m3/weights_transfer_key"
TRANSFER_KNOWN_HOSTS = "/etc/m3/weights_known_hosts"
AUTHORIZED_KEYS = "/root/.ssh/authorized_keys"
LOCK_NAME = ".m3-weights.lock"
LOCK_WAIT_S = 6 * 3600  # another deploy staging into the same cache: wait for it, then rsync finds little to do
# -a keeps the cache's relative symlinks (snapshots -> ../../blobs); partial files wait in .m3-partial (never
# under a blob's name) and resume from there; rsync checks every file it moved with a whole-file checksum
RSYNC_FLAGS = ("-a", "--partial-dir=.m3-partial", "--exclude=*.incomplete", "--exclude=.m3-partial")


def _hub(weights_dir: str) -> str:
    return f"{weights_dir.rstrip('/')}/hub"


def _folder(weights_dir: str, repo: str) -> str:
    return str(hfcache.repo_folder(_hub(weights_dir), repo))


def marker_for(weights_dir: str, repo: str, commit: str) -> str:
    """The marker of one repo: with the commit when it is known (controller), so a new commit is staged again."""
    return marker_path(weights_dir, f"{repo}@{commit}" if commit else repo)


def _addr(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def authorized_entry(public_key: str, hub: str, addresses) -> str:
    """The senders' authorized_keys line: read-only rsync of the HF hub cache, from cluster addresses only."""
    return (f'restrict,from="{",".join(addresses)}",command="/usr/bin/rrsync -ro {hub}" {public_key}')


def snapshot_filter(revision: str, commit: str, blobs) -> list[str]:
    """rsync filter rules sending only one snapshot of a repo folder: its ref, its snapshot directory and the
    blobs it links to (a cache that also holds older revisions sends none of theirs)."""
    return (["--include=/refs/", f"--include=/refs/{revision}", "--include=/snapshots/",
             f"--include=/snapshots/{commit}/***", "--include=/blobs/"]
            + [f"--include=/blobs/{b}" for b in sorted(blobs)] + ["--exclude=*"])


def snapshot_blobs(snapshot: str | Path) -> list[str]:
    """The blob names a snapshot directory's symlinks point to (huggingface_hub: ../../blobs/<etag>)."""
    out = set()
    for d, _, names in os.walk(snapshot):
        for n in names:
            p = os.path.join(d, n)
            if os.path.islink(p):
                out.add(os.path.basename(os.readlink(p)))
    return sorted(out)


def pull_command(weights_dir: str, repo: str, sender_address: str, only: list[str] = ()) -> str:
    """On the receiver: pull one repo folder from the sender's rrsync-restricted hub, under the cache lock."""
    ssh = shlex.join(["ssh", "-i", TRANSFER_KEY, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                      "-o", f"UserKnownHostsFile={TRANSFER_KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes"])
    name = hfcache.repo_folder("", repo).name
    return shlex.join(["flock", "-w", str(LOCK_WAIT_S), f"{_hub(weights_dir)}/{LOCK_NAME}", "rsync", *RSYNC_FLAGS,
                       *only, "-e", ssh, f"root@{_addr(sender_address)}:{name}/", f"{_folder(weights_dir, repo)}/"])


def push_argv(src_folder: str, weights_dir: str, repo: str, data, name: str, only: list[str] = ()) -> list[str]:
    """On the controller: push one repo folder to a host over the inventory's SSH; the host side runs under the
    cache lock (--rsync-path)."""
    from m3deploy.check.checks import ssh_argv, ssh_target
    from m3deploy.core.connection import sudo_args

    hub = _hub(weights_dir)
    ssh = ssh_argv(data) + ["-o", "BatchMode=yes"]
    sudo = "sudo -n " if sudo_args(data).get("_sudo") else ""  # a non-root login user with sudo (`_sudo`)
    remote = (f"{sudo}mkdir -p {shlex.quote(hub)} && {sudo}flock -w {LOCK_WAIT_S} "
              f"{shlex.quote(f'{hub}/{LOCK_NAME}')} rsync")
    target = ssh_target(data, name)
    user, at, hostname = target.rpartition("@")
    return ["rsync", *RSYNC_FLAGS, *only, "-e", shlex.join(ssh), f"--rsync-path={remote}", f"{src_folder.rstrip('/')}/",
            f"{user}{at}{_addr(hostname)}:{_folder(weights_dir, repo)}/"]


def _push(argv: list[str], what: str) -> None:
    import subprocess

    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise M3Error(f"{what}: rsync exited {r.returncode}: {r.stderr.strip()[-600:]}. Fix: check the "
                      "controller reaches the host over SSH (rsync on both sides), then run the deploy again "
                      "(rsync resumes)")


def check_command(weights_dir: str, r, marker: str) -> str:
    return f"{hfcache.remote_command(_hub(weights_dir), [hfcache.spec(r)])} && touch {shlex.quote(marker)}"


@operation()
def weights_round(transfers=()):
    """One round on one receiver: (command or FunctionCommand) per repo it gets this round; none: no change."""
    for t in transfers:
        yield t


def _controller_hub(cp) -> Path:
    from m3deploy.controller.artifacts import cache_root

    cache = cp.setting("m3_weights_controller_cache")
    if cache:
        return Path(cache).expanduser() / "hub"
    if cp.setting("m3_mock_repo_mb"):
        return cache_root() / "mock-hf" / "hub"  # mock repos never land in the user's own HF cache
    return Path(os.environ.get("HF_HOME") or Path("~/.cache/huggingface").expanduser()) / "hub"


_staged_lock = threading.Lock()
_fanout_lock = threading.Lock()


def _controller_repos(cp) -> dict[str, tuple[str, str, list[str]]]:
    """repo -> (its folder in the controller's hub cache, commit, the rsync filter sending only that commit):
    each repo downloaded or built once, then checked complete against its safetensors index. Memoised per run
    (every host's greenlet asks)."""
    with _staged_lock:
        memo = getattr(state, "_m3_controller_repos", None)
        if memo is not None:
            return memo
        hub = _controller_hub(cp)
        mb = cp.setting("m3_mock_repo_mb")
        out = {}
        for r in cp.model_repos:
            if mb:
                from m3deploy.controller import mockrepos

                mockrepos.make_repo(hub, r.repo, size_mb=mb, shards=max(1, -(-mb // 100)), revision=r.revision,
                                    tokenizer=r.role != "draft")  # a draft head has no tokenizer
            elif not hfcache.check_repo(hub, r.repo, r.revision, r.role)["ok"]:
                _hub_download(hub, r)
            got = hfcache.check_repo(hub, r.repo, r.revision, r.role)
            if not got["ok"]:
                raise M3Error(f"m3_weights_source=controller: {r.repo} is not complete in {hub}: {got['detail']}. "
                              f"Fix: `HF_HOME={hub.parent} hf download {r.repo}` on the controller, or point "
                              "m3_weights_controller_cache at a cache that holds it")
            folder = hfcache.repo_folder(hub, r.repo)
            blobs = snapshot_blobs(folder / "snapshots" / got["commit"])
            out[r.repo] = (str(folder), got["commit"], snapshot_filter(r.revision, got["commit"], blobs))
        state._m3_controller_repos = out
        return out


def _hub_download(hub: Path, r) -> None:
    from m3deploy.controller.cachelock import locked

    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise M3Error("m3_weights_source=controller downloads with huggingface_hub on the controller. "
                      "Fix: pip install huggingface_hub") from e
    with locked(hub / ".locks" / hfcache.repo_folder(hub, r.repo).name / "m3deploy-stage", f"downloading {r.repo}"):
        host.log(f"downloading {r.repo} into the controller's cache {hub} (resumable)")
        snapshot_download(r.repo, revision=r.revision, cache_dir=str(hub), token=controller_token(context.host_plan()))


def _plan(cp, root: str) -> dict:
    """The run's fan-out, the same on every host: per repo its schedule over the hosts that lack it."""
    with _fanout_lock:  # one greenlet computes it (every host's facts, one at a time); the others wait
        memo = getattr(state, "_m3_fanout", None)
        if memo is None:
            memo = state._m3_fanout = _compute_plan(cp, root)
        return memo


def _compute_plan(cp, root: str) -> dict:
    hosts = [h for h in _weights_hosts(cp) if h.name != root]
    repos = _controller_repos(cp) if root == fanout.CONTROLLER else {}
    degree = cp.setting("m3_weights_fanout")
    per_repo, markers = {}, {}
    for r in cp.model_repos:
        commit = repos.get(r.repo, ("", "", []))[1]
        todo = []
        for h in hosts:
            markers[(h.name, r.repo)] = marker_for(h.weights_dir, r.repo, commit)
            if not context.pyinfra_host(h.name).get_fact(File, path=markers[(h.name, r.repo)]):
                todo.append(h.name)
        per_repo[r.repo] = fanout.schedule(root, todo, degree)
    rounds = max((len(s) for s in per_repo.values()), default=0)
    senders = sorted({t.sender for s in per_repo.values() for rnd in s for t in rnd} - {fanout.CONTROLLER})
    pulls = sorted({t.receiver for s in per_repo.values() for rnd in s for t in rnd if t.sender != fanout.CONTROLLER})
    for repo, s in per_repo.items():
        if s:
            logger.info(f"weights fan-out of {repo} (degree {degree}, {plural(len(s), 'round')}):\n"
                        f"{fanout.describe(s)}")
    return {"root": root, "per_repo": per_repo, "rounds": rounds, "markers": markers, "repos": repos,
            "senders": senders, "pulls": pulls, "degree": degree}


def _host_key(name: str) -> str:
    key = context.pyinfra_host(name).get_fact(Command, command="cat /etc/ssh/ssh_host_ed25519_key.pub")
    if not key or not str(key).startswith("ssh-"):
        raise M3Error(f"host {name}: no /etc/ssh/ssh_host_ed25519_key.pub to pin for the weights fan-out. "
                      f"Fix: `ssh-keygen -A` on {name}, or m3_weights_source = 'controller'")
    return " ".join(str(key).split()[:2])


def _fan_out(hp, cp, root: str):
    p = _plan(cp, root)
    if not p["rounds"]:
        return
    name = hp.name
    addresses = [h.address for h in _weights_hosts(cp)]
    files.directory(name=f"Create {_hub(hp.weights_dir)}", path=_hub(hp.weights_dir), mode="755")
    apt.packages(name="Install rsync (weights fan-out)", packages=["rsync"], no_recommends=True, update=True,
                 cache_time=3600, **hostops.APT_RETRIES)
    if p["senders"] or p["pulls"]:
        from m3deploy.controller.secrets import ensure_transfer_key

        key_path, public = ensure_transfer_key(cp.name)
    entry_marker = f" m3deploy-weights-{cp.name}"
    if name in p["senders"]:
        entry = authorized_entry(public, _hub(hp.weights_dir), addresses)
        server.shell(name=f"Allow read-only rsync of {_hub(hp.weights_dir)} to the cluster (rrsync -ro)", commands=[
            "mkdir -p -m 700 /root/.ssh && touch " + AUTHORIZED_KEYS + " && chmod 600 " + AUTHORIZED_KEYS,
            f"{{ grep -v -F -e {shlex.quote(entry_marker)} {AUTHORIZED_KEYS}; printf '%s\\n' {shlex.quote(entry)}; }}"
            f" > {AUTHORIZED_KEYS}.m3tmp && chmod 600 {AUTHORIZED_KEYS}.m3tmp && mv {AUTHORIZED_KEYS}.m3tmp "
            f"{AUTHORIZED_KEYS}"])
    if name in p["pulls"]:
        known = "".join(f"{_addr(cp.host(s).address)} {_host_key(s)}\n" for s in p["senders"])
        files.directory(name="Create /etc/m3", path="/etc/m3", user="root", group="root", mode="700")
        files.put(name=f"Upload the weights transfer key to {TRANSFER_KEY} (0600)", src=str(key_path),
                  dest=TRANSFER_KEY, user="root", group="root", mode="600")
        files.put(name=f"Pin the senders' host keys in {TRANSFER_KNOWN_HOSTS}", src=StringIO(known),
                  dest=TRANSFER_KNOWN_HOSTS, user="root", group="root", mode="644")
    for i in host.loop(range(p["rounds"])):
        todo = []
        for r in cp.model_repos:
            got = fanout.sender_of(p["per_repo"][r.repo], name)
            if not got or got[0] != i:
                continue
            sender, marker = got[1], p["markers"][(name, r.repo)]
            src, _, only = p["repos"].get(r.repo, ("", "", []))  # mirror: the whole folder (commit not known yet)
            if sender == fanout.CONTROLLER:
                todo.append(FunctionCommand(_push, (push_argv(src, hp.weights_dir, r.repo, host.data, name, only),
                                                    f"push {r.repo} to {name}"), {}))
            else:
                todo.append(StringCommand(pull_command(hp.weights_dir, r.repo, cp.host(sender).address, only)))
            todo.append(StringCommand(check_command(hp.weights_dir, r, marker)))
            frm = "the controller" if sender == fanout.CONTROLLER else sender
            todo.append(FunctionCommand(host.log, (f"round {i + 1}/{p['rounds']}: {r.repo} from {frm}: complete "
                                                   f"against its index",), {}))
        n = sum(1 for s in p["per_repo"].values() if i < len(s) for _ in s[i])
        weights_round(name=f"Weights round {i + 1}/{p['rounds']}: {n} transfer(s), each holder sends to at most "
                           f"{p['degree']}", transfers=todo)
    if name in p["pulls"]:
        files.file(name=f"Remove {TRANSFER_KEY}", path=TRANSFER_KEY, present=False)
    if name in p["senders"]:
        server.shell(name="Remove the weights transfer key from authorized_keys", commands=[
            f"grep -v -F -e {shlex.quote(entry_marker)} {AUTHORIZED_KEYS} > {AUTHORIZED_KEYS}.m3tmp; "
            f"chmod 600 {AUTHORIZED_KEYS}.m3tmp && mv {AUTHORIZED_KEYS}.m3tmp {AUTHORIZED_KEYS}"])
