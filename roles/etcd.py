"""etcd for Dynamo's discovery: Debian's etcd-server, run by our etcd.service on the cluster address.

Reads (through m3deploy.deploy.context): cluster_plan().name; host_plan().services of kind "etcd"
(argv, env, secret_env, env_file, workdir, readiness). Data keys behind them: m3_etcd_* as the
plan resolves them; secrets from the controller's store (~/.config/m3deploy/<cluster>/secrets.json).

Auth: when the service has secret M3_ETCD_ROOT_PASSWORD, files/m3-etcd-auth.py (ExecStartPost)
turns etcd authentication on and creates the Dynamo user (role m3, readwrite on all keys).
Auth tokens are JWTs signed with a key pair made on the host (m3deploy.core.build.etcd_jwt_option says why).
Our /etc/systemd/system/etcd.service overrides the package's unit of the same name.
"""
import shlex

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import apt

from m3deploy.core.build import etcd_jwt_keys
from m3deploy.deploy import hostfiles
from m3deploy.deploy.hostfiles import AUTH_SCRIPT  # noqa: F401 (the path, for readers of this role)
from roles import _units as u

USER = "etcd"  # created by the etcd-server package


@operation()
def ensure_jwt_keys(key: str, pub: str):
    """An RSA key pair for etcd's JWT auth tokens, made on the host once (0600 etcd: the private key never
    leaves it). Regenerating it would log every client out, so an existing key is kept."""
    if host.get_fact(u.PathState, path=key) != "-" and host.get_fact(u.PathState, path=pub) != "-":
        return
    k, p = shlex.quote(key), shlex.quote(pub)
    yield (f"umask 077 && openssl genrsa -out {k} 2048 2>/dev/null && openssl rsa -in {k} -pubout -out {p} "
           f"2>/dev/null && chown {USER}:{USER} {k} {p} && chmod 0600 {k} && chmod 0644 {p}")


@deploy("Deploy etcd")
def deploy_etcd():
    cp, hp = u.plans()
    for s in u.services(hp, "etcd"):
        apt.packages(name="Install etcd-server", packages=["etcd-server"], no_recommends=True,
                     update=True, cache_time=3600)
        u.ensure_workdir(s, USER)
        changed = []
        if hostfiles.etcd_auth(s):
            key, pub = etcd_jwt_keys(s.workdir)
            changed.append(ensure_jwt_keys(name=f"Make etcd's JWT signing key {key}", key=key, pub=pub))
            changed.append(u.ship(hostfiles.auth_script(), name=f"Ship {AUTH_SCRIPT}"))
        unit_op, env_op = u.install_service(cp, s)
        started = u.start_or_restart(s, unit_op, [unit_op, env_op, *changed])
        u.wait_ready(s, started)
