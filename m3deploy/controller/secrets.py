"""The controller's secrets store: generated once per cluster, kept 0600 on the controller.

`~/.config/m3deploy/<cluster>/secrets.json` (dir 0700, file 0600; `M3DEPLOY_CONFIG` moves the root).
Secrets reach hosts only inside 0600 root env files rendered at deploy time (service.env.j2);
they are never in the plan, argv, unit files or config files.

The API key (m3_api_key_file) is the user's, not generated: read from that 0600 file on the controller by
`api_key(plan)`, for the engines' env files (secret name m3deploy.core.build.API_KEY_SECRET) and for every
client of the endpoint (verify's smoke checks, the deploy's serving check, the rollout, bench).
"""
from __future__ import annotations

import json
import os
import re
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


API_KEY_FIX = ("Fix: write the key there on one line (with the edge: one key per line) and make it private, e.g. "
               "`openssl rand -hex 32 > FILE && chmod 600 FILE` (docs/OPERATIONS.md \"API key\")")


def require_private(path: Path, where: str) -> None:
    """Refuse a controller secret file that others can read (any group/other bit): M3Error naming `where` (the
    key or file) and the fix. The one owner of this rule for every secret file m3deploy reads."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise M3Error(f"{where} is readable by others (mode {mode:o}). Fix: chmod 600 {path}")


def read_api_keys(path: str, several: bool = False) -> list[str]:
    """The keys in m3_api_key_file (a controller path): a regular file, mode 0600 or stricter, one key per line,
    each printable ASCII without spaces (an HTTP header value); several lines only where `several` (the edge
    takes every one: a rotation keeps the old key valid while clients move to the new one). Raises M3Error naming
    the key, the file and the fix; the message never holds the file's content."""
    p = Path(path).expanduser()
    where = f"key m3_api_key_file: {p}"
    if p.is_dir():
        raise M3Error(f"{where} is a directory, not a file. Fix: name the key file in it (one key per line, chmod 600)")
    if not p.is_file():
        raise M3Error(f"{where} does not exist on the controller (or is not a file). {API_KEY_FIX}")
    require_private(p, where)
    try:
        lines = p.read_text(encoding="ascii").strip().splitlines()
    except (OSError, UnicodeError) as e:
        raise M3Error(f"{where} cannot be read as text ({type(e).__name__}). {API_KEY_FIX}") from None
    keys = [ln.strip() for ln in lines if ln.strip()]
    if not keys:
        raise M3Error(f"{where} is empty: an empty key would leave the API open. {API_KEY_FIX}")
    if len(keys) > 1 and not several:
        raise M3Error(f"{where} holds more than one line (values not shown); several keys at once are taken only by "
                      f"the edge (m3_edge = true). {API_KEY_FIX}")
    bad = [i + 1 for i, k in enumerate(keys) if not re.fullmatch(r"[!-~]+", k)]
    if bad:
        lines = ", ".join(map(str, bad))
        raise M3Error(f"{where} has line(s) {lines} holding spaces or control characters (values not "
                      f"shown); clients send a key as `Authorization: Bearer KEY`. {API_KEY_FIX}")
    return keys


def read_api_key(path: str) -> str:
    """The one key of a standalone engine's m3_api_key_file (read_api_keys)."""
    return read_api_keys(path)[0]


def api_keys(plan) -> list[str]:
    """Every valid key of the cluster (m3_api_key_file; several, one per line, with the edge), [] without one."""
    st = dict(plan.settings)
    path = st.get("m3_api_key_file")
    return read_api_keys(path, several=bool(st.get("m3_edge"))) if path else []


def api_key(plan) -> str | None:
    """The key our clients send (the file's first line), or None when the cluster has none."""
    keys = api_keys(plan)
    return keys[0] if keys else None


# Made on demand (not for every cluster): name -> (what it is, generator).
ON_DEMAND = {
    "etcd-jwt-key": "RSA private key (PEM) signing etcd's JWT auth tokens when etcd has several members: every member "
                    "must verify every other member's tokens, so they share one key (a single member makes its own "
                    "on its host instead)",
}


def _rsa_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption()).decode()


def public_pem(private_pem: str) -> str:
    """The public half of an ON_DEMAND RSA key (PEM)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


_GENERATE = {"etcd-jwt-key": _rsa_pem}

# Key pairs made on demand (m3deploy.core.mpi: a worker that is one MPI world over several hosts): private key name
# -> its public half's name. Both made at once (ed25519, OpenSSH format, no passphrase), so they always match.
PAIRS = {"mpi-ssh-key": "mpi-ssh-key-pub", "mpi-host-key": "mpi-host-key-pub"}
ON_DEMAND.update({
    "mpi-ssh-key": "ed25519 private key mpirun's ssh logs in with, on rank 0 of a multi-host TensorRT-LLM worker",
    "mpi-ssh-key-pub": "its public half: the followers' authorized_keys (from rank 0's address only)",
    "mpi-host-key": "ed25519 host key of the sshd a multi-host TensorRT-LLM worker's ranks > 0 run",
    "mpi-host-key-pub": "its public half: pinned in rank 0's known_hosts (StrictHostKeyChecking yes)",
})


def _ed25519_pair(comment: str) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, f"{public.decode()} {comment}"


def _generate(data: dict[str, str], name: str, cluster: str) -> None:
    private = next((k for k, pub in PAIRS.items() if name in (k, pub)), None)
    if private is None:
        data[name] = _GENERATE.get(name, _new_value)()
    elif name not in data:  # made with its other half
        data[private], data[PAIRS[private]] = _ed25519_pair(f"m3deploy-{private}-{cluster}")


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
    require_private(path, str(path))
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

    Under the store's lock (m3deploy.controller.cachelock): two hosts' greenlets, or two processes, deploying one
    cluster
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
                _generate(data, n, cluster)
            write_secrets(cluster, data)
    return data


def write_secrets(cluster: str, data: dict[str, str]) -> None:
    """Replace the store atomically (created 0600); callers hold its lock (m3deploy.controller.cachelock)."""
    path = secrets_path(cluster)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def ensure_transfer_key(cluster: str) -> tuple[Path, str]:
    """The cluster's weights transfer key pair (ed25519, no passphrase), made once with ssh-keygen:
    `<config>/<cluster>/weights_transfer_ed25519` (0600) and its `.pub`. Returns (private key path, public key
    line). Hosts get the private key as a root-only 0600 file; the public key goes into the senders'
    authorized_keys restricted to `rrsync -ro` and the cluster's addresses (roles/weights.py)."""
    import subprocess

    path = secrets_path(cluster).with_name("weights_transfer_ed25519")
    pub = path.with_name(path.name + ".pub")
    if not (path.is_file() and pub.is_file()):
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        with locked(path, f"the weights transfer key of {cluster}"):
            if not (path.is_file() and pub.is_file()):
                for p in (path, pub):
                    if p.exists():
                        p.unlink()
                r = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"m3deploy-weights-{cluster}",
                                    "-f", str(path)], capture_output=True, text=True)
                if r.returncode:
                    raise M3Error(f"ssh-keygen could not make {path}: {r.stderr.strip()}. Fix: install openssh-client")
    require_private(path, str(path))
    return path, pub.read_text().strip()
