"""The Dynamo frontend (OpenAI HTTP + KV router), native from the versioned venv.

Reads (through m3deploy.deploy.context): cluster_plan().name; host_plan().services of kind "frontend":
argv/command, env (ETCD_ENDPOINTS, NATS_SERVER, DYN_* advertised addresses, HOME, ...),
secret_env (ETCD_AUTH_PASSWORD, NATS_AUTH_PASSWORD), env_file, workdir, readiness.
Runs as system user m3 (root only when the plan gives it a container image).
Needs deploy_artifacts() first (venv) and etcd/NATS ready.
"""
from pyinfra.api import deploy

from m3deploy.core import internal_tls
from m3deploy.deploy import hostfiles
from m3deploy.deploy.hostfiles import WATCHDOG
from roles import _units as u
from roles.edge import restart_frontend


@deploy("Deploy the Dynamo frontend")
def deploy_frontend():
    cp, hp = u.plans()
    for s in u.services(hp, "frontend"):
        if not s.image:
            u.ensure_m3_user()
        u.ensure_workdir(s, hostfiles.service_user(s))
        # m3_internal_tls: its client certificate for etcd and NATS (0600 m3); a change restarts it
        certs = [u.ship(f, name=f"Ship {f.path}") for f in hostfiles.config_files(s, u.secrets_for(cp))]
        if internal_tls.launcher(s):  # ExecStart starts with it (files/m3-tls-env)
            certs.append(u.ship(hostfiles.tls_launcher(), name=f"Ship {internal_tls.LAUNCHER}"))
        unit_op, env_op = u.install_service(cp, s)
        if any(x.kind == "edge" for h in cp.hosts for x in h.services):  # drained at the edge (roles/edge.py)
            started = restart_frontend(cp, s, unit_op, u.changes(s, unit_op, env_op, *certs))
        else:
            started = u.activate(s.unit, unit_op, u.changes(s, unit_op, env_op, *certs))
        u.wait_ready(s, started)
        if hostfiles.has_watchdog(s):
            _watchdog(cp, s)


def _watchdog(cp, s):
    """m3-frontend-watchdog.service restarts the frontend when its /live stops answering while the unit is active:
    after losing its etcd lease the frontend can hang in shutdown instead of exiting (files/m3-watchdog.py)."""
    name = hostfiles.watchdog_unit_name(s)
    script = u.ship(hostfiles.watchdog_script(), name=f"Ship {WATCHDOG}")
    unit = u.ship(hostfiles.watchdog_unit(cp, s))
    u.activate(name, unit, [script, unit], tracked=False)
