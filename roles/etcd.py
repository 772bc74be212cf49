"""etcd for Dynamo's discovery: Debian's etcd-server, run by our etcd.service on the cluster address.

Reads (through m3deploy.deploy.context): cluster_plan().name; host_plan().services of kind "etcd"
(argv, env, secret_env, env_file, workdir, readiness). Data keys behind them: m3_etcd_* as the
plan resolves them; secrets from the controller's store (~/.config/m3deploy/<cluster>/secrets.json).

Auth: when the service has secret M3_ETCD_ROOT_PASSWORD, files/m3-etcd-auth.py (ExecStartPost)
turns etcd authentication on and creates the Dynamo user (role m3, readwrite on all keys).
Auth tokens are JWTs signed with a key pair made on the host (m3deploy.core.build.etcd_jwt_option says why);
with 3 members (3 control hosts) one key pair from the controller's secrets store, shared by all of them.
Only the first member's service carries the auth secrets and runs the auth script (auth is cluster-wide).
Our /etc/systemd/system/etcd.service overrides the package's unit of the same name.
"""
import shlex

from pyinfra import host
from pyinfra.api import deploy, operation

from m3deploy.controller.secrets import ensure_secrets, public_pem
from m3deploy.core import components
from m3deploy.core.build import etcd_jwt_keys
from m3deploy.deploy import hostfiles
from roles import hostops, lifecycle

USER = components.get("etcd").user  # created by its package


@operation()
def ensure_jwt_keys(key: str, pub: str):
    """An RSA key pair for etcd's JWT auth tokens, made on the host once (0600 etcd: the private key never
    leaves it). Regenerating it would log every client out, so an existing key is kept."""
    if host.get_fact(hostops.PathState, path=key) != "-" and host.get_fact(hostops.PathState, path=pub) != "-":
        return
    k, p = shlex.quote(key), shlex.quote(pub)
    yield (f"umask 077 && openssl genrsa -out {k} 2048 2>/dev/null && openssl rsa -in {k} -pubout -out {p} "
           f"2>/dev/null && chown {USER}:{USER} {k} {p} && chmod 0600 {k} && chmod 0644 {p}")


def _jwt_keys(cp, key: str, pub: str) -> list:
    """One etcd member makes its key pair on its host. Several members verify each other's tokens (a client's
    token is checked by whichever member it talks to), so they share the controller's key (secrets store,
    m3deploy.controller.secrets.ON_DEMAND), written 0600 etcd."""
    if sum(1 for h in cp.hosts for x in h.services if x.kind == "etcd") < 2:
        return [ensure_jwt_keys(name=f"Make etcd's JWT signing key {key}", key=key, pub=pub)]
    pem = ensure_secrets(cp.name, names=("etcd-jwt-key",))["etcd-jwt-key"]
    return [hostops.put_text(name=f"Render etcd's shared JWT signing key {key}", text=pem, dest=key, mode="0600",
                             user=USER, group=USER),
            hostops.put_text(name=f"Render {pub}", text=public_pem(pem), dest=pub, mode="0644", user=USER, group=USER)]


@deploy("Deploy etcd")
def deploy_etcd():
    cp, hp = lifecycle.plans()
    for s in lifecycle.role_services(hp, __name__):
        lifecycle.install(s.kind)
        lifecycle.ensure_workdir(s, hostfiles.service_user(s))
        changed = []
        if "--auth-token" in s.argv:  # every member of an etcd with auth
            key, pub = etcd_jwt_keys(s.workdir)
            changed += _jwt_keys(cp, key, pub)
        # the first member only: files/m3-etcd-auth.py (ExecStartPost) turns auth on
        changed += lifecycle.ship_scripts(s)
        # m3_internal_tls: its certificate, key and the cluster CA (0600 etcd); a change restarts it
        changed += lifecycle.ship_config_files(cp, s)
        unit_op, env_op = lifecycle.install_service(cp, s)
        started = lifecycle.activate(s.unit, unit_op, lifecycle.changes(s, unit_op, env_op, *changed))
        lifecycle.wait_ready(s, started)
