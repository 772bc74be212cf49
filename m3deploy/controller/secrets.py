"""The controller's secrets store: generated once per cluster, kept 0600 on the controller.

`~/.config/m3deploy/<cluster>/secrets.json` (dir 0700, file 0600; `M3DEPLOY_CONFIG` moves the root).
Secrets reach hosts only inside 0600 root env files rendered at deploy time (service.env.j2);
they are never in the plan, argv, unit files or config files.
"""
from __future__ import annotations

import json
import os
import secrets as _secrets
import stat
from pathlib import Path

from m3deploy.controller.cachelock import locked
from m3deploy.core.errors import M3Error

# name -> what it is. Values: "m3p-" + 32 url-safe chars (a letter first, so config parsers never
# read it as a number).
KNOWN = {
    "nats-password": "password of the NATS user Dynamo connects as (NATS_AUTH_PASSWORD)",
    "etcd-root-password": "password of etcd's root user (admin; only the etcd host's env file)",
    "etcd-password": "password of the etcd user Dynamo connects as (ETCD_AUTH_PASSWORD)",
}


def config_root() -> Path:
    base = os.environ.get("M3DEPLOY_CONFIG") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "m3deploy")
    return Path(base)


def secrets_path(cluster: str) -> Path:
    if not cluster or "/" in cluster or cluster.startswith("."):
        raise M3Error(f"bad cluster name {cluster!r} for the secrets store")
    return config_root() / cluster / "secrets.json"


def _new_value() -> str:
    return "m3p-" + _secrets.token_urlsafe(24)


def load_secrets(cluster: str) -> dict[str, str]:
    path = secrets_path(cluster)
    if not path.exists():
        return {}
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise M3Error(f"{path} is readable by others (mode {mode:o}); fix: chmod 600 {path}")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise M3Error(f"{path} is not valid JSON ({e}); fix it or move it away (hosts keep the old "
                      "secrets until the next deploy)") from e
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise M3Error(f"{path} must be a JSON object of strings")
    return data


def ensure_secrets(cluster: str, names=tuple(KNOWN)) -> dict[str, str]:
    """Load the store, adding any missing secret (generated once, then reused forever).

    Under the store's lock (m3deploy.controller.cachelock): two hosts' greenlets, or two processes, deploying one cluster
    at once must never generate two different passwords (hosts would get mismatched secrets)."""
    data = load_secrets(cluster)
    if all(n in data for n in names):
        return data
    path = secrets_path(cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with locked(path, f"the secrets store of {cluster}"):
        data = load_secrets(cluster)  # another writer may have added them while we waited
        missing = [n for n in names if n not in data]
        if missing:
            for n in missing:
                data[n] = _new_value()
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
    return data
