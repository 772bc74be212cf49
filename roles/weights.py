"""Model weights: download every repo the workers load (cluster_plan().model_repos: the target checkpoint, EAGLE3
draft heads, a separate tokenizer) once per host into the HF cache directory the worker containers mount
(host_plan().weights_dir -> /root/.cache/huggingface), resumable, then verified with `hf cache verify` and
checked complete against its safetensors index (m3deploy.check.hfcache); workers then run with
HF_HUB_OFFLINE=1 (set by the plan).

The Hugging Face token comes from the controller (env HF_TOKEN, or the 0600 file named by
m3_hf_token_file), is delivered to the host as a root-only 0600 file and read from there by the
download (HF_TOKEN_PATH): never in argv, op names or logs; removed after the download.

Reads host_plan(): weights_dir, weights_gb, services (worker image); cluster_plan(): model_repos, venv,
hosts. Data keys:
- m3_hf_token_file (controller path, must be 0600)
- m3_hf_cache_shared (the cache is one shared filesystem: only the first GPU host downloads)
- m3_weights_download ("image": `hf` inside the worker image via docker; "host": `hf` on the host;
  default "image" when the worker has an image)
- m3_hf_cli (host path of `hf`, default <venv>/bin/hf or `hf`), m3_weights_verify (default True)
"""
from __future__ import annotations

import os
import re
import shlex
import stat
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import files, server

from m3deploy.check import hfcache
from m3deploy.core import settings
from m3deploy.core.errors import M3Error

TOKEN_PATH = "/etc/m3/hf_token"
CONTAINER_CACHE = "/root/.cache/huggingface"
CONTAINER_TOKEN = "/run/secrets/hf_token"


def controller_token() -> str | None:
    """HF_TOKEN from the controller's environment, else the m3_hf_token_file (0600), else None."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"].strip()
    path = host.data.get("m3_hf_token_file")
    if not path:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        raise M3Error(f"m3_hf_token_file: {p} does not exist. Fix: write the token there (chmod 600) or set HF_TOKEN")
    if stat.S_IMODE(p.stat().st_mode) & 0o077:
        raise M3Error(f"m3_hf_token_file: {p} is readable by others (mode {oct(stat.S_IMODE(p.stat().st_mode))}). "
                      f"Fix: chmod 600 {p}")
    return p.read_text().strip() or None


def marker_path(weights_dir: str, model_id: str) -> str:
    return f"{weights_dir.rstrip('/')}/.m3-complete-{re.sub(r'[^A-Za-z0-9._-]+', '--', model_id)}"


@deploy("Model weights")
def deploy_weights():
    from m3deploy.deploy import context

    hp = context.host_plan()
    if not hp.weights_dir or hp.weights_gb <= 0:
        return
    cp = context.cluster_plan()
    if host.data.get("m3_hf_cache_shared"):
        first = next((h.name for h in cp.hosts if h.weights_dir and h.weights_gb > 0), hp.name)
        if first != hp.name:
            return
    todo = [r for r in cp.model_repos if not host.get_fact(File, path=marker_path(hp.weights_dir, r.repo))]
    if not todo:
        return
    image = next((s.image for s in hp.services if s.kind == "worker" and s.image), "")
    mode = settings.get(host.data, "m3_weights_download") or ("image" if image else "host")
    token = controller_token()
    files.directory(name=f"Create {hp.weights_dir}", path=hp.weights_dir, mode="755")
    if token:
        files.directory(name="Create /etc/m3", path="/etc/m3", user="root", group="root", mode="700")
        files.put(name=f"Upload the Hugging Face token to {TOKEN_PATH} (0600)", src=StringIO(token + "\n"),
                  dest=TOKEN_PATH, user="root", group="root", mode="600")
    verify = settings.get(host.data, "m3_weights_verify")
    if mode == "image":
        if not image:
            raise M3Error(f"host {hp.name}: m3_weights_download is 'image' but no worker on it has an image. "
                          "Fix: set m3_weights_download = 'host'")
        secret = f"-v {TOKEN_PATH}:{CONTAINER_TOKEN}:ro -e HF_TOKEN_PATH={CONTAINER_TOKEN} " if token else ""
        hf = (f"docker run --rm --network=host -v {shlex.quote(hp.weights_dir)}:{CONTAINER_CACHE} {secret}"
              f"--entrypoint hf {shlex.quote(image)}")
    else:
        cli = settings.get(host.data, "m3_hf_cli") or (f"{cp.venv}/bin/hf" if cp.venv else "hf")
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
