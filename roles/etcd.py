"""etcd for Dynamo's discovery: Debian's etcd-server, run by our etcd.service on the cluster address.

Reads (through m3deploy.deploy.context): cluster_plan().name; host_plan().services of kind "etcd"
(argv, env, secret_env, env_file, workdir, readiness). Data keys behind them: m3_etcd_* as the
plan resolves them; secrets from the controller's store (~/.config/m3deploy/<cluster>/secrets.json).

Auth: when the service has secret M3_ETCD_ROOT_PASSWORD, files/m3-etcd-auth.py (ExecStartPost)
turns etcd authentication on and creates the Dynamo user (role m3, readwrite on all keys).
Our /etc/systemd/system/etcd.service overrides the package's unit of the same name.
"""
from pyinfra.api import deploy
from pyinfra.operations import apt, files

from roles import _units as u

AUTH_SCRIPT = "/usr/local/lib/m3/m3-etcd-auth.py"
USER = "etcd"  # created by the etcd-server package


@deploy("Deploy etcd")
def deploy_etcd():
    cp, hp = u.plans()
    for s in u.services(hp, "etcd"):
        apt.packages(name="Install etcd-server", packages=["etcd-server"], no_recommends=True,
                     update=True, cache_time=3600)
        u.ensure_workdir(s, USER)
        auth = any(k == "M3_ETCD_ROOT_PASSWORD" for k, _ in s.secret_env)
        changed = []
        if auth:
            changed.append(files.put(name=f"Ship {AUTH_SCRIPT}", src=str(u.REPO / "files/m3-etcd-auth.py"),
                                     dest=AUTH_SCRIPT, user="root", group="root", mode="0755"))
        unit_op, env_op = u.install_service(cp, s, "etcd.service.j2", USER,
                                            auth_script=AUTH_SCRIPT if auth else "")
        started = u.start_or_restart(s, unit_op, [unit_op, env_op, *changed])
        u.wait_ready(s, started)
