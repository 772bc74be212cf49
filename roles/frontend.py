"""The Dynamo frontend (OpenAI HTTP + KV router), native from the versioned venv.

Reads (through m3deploy.deploy.context): cluster_plan().name; host_plan().services of kind "frontend":
argv/command, env (ETCD_ENDPOINTS, NATS_SERVER, DYN_* advertised addresses, HOME, ...),
secret_env (ETCD_AUTH_PASSWORD, NATS_AUTH_PASSWORD), env_file, workdir, readiness.
Runs as system user m3 (root only when the plan gives it a container image).
Needs deploy_artifacts() first (venv) and etcd/NATS ready.
"""
from pyinfra.api import deploy

from m3deploy.core import components
from m3deploy.deploy import hostfiles
from roles import hostops, lifecycle
from roles.edge import edges, restart_frontend


@deploy("Deploy the Dynamo frontend")
def deploy_frontend():
    cp, hp = lifecycle.plans()
    for s in lifecycle.role_services(hp, __name__):
        if not s.image:
            lifecycle.ensure_m3_user()
        lifecycle.ensure_workdir(s, hostfiles.service_user(s))
        # m3_internal_tls: its client certificate for etcd and NATS (0600 m3); a change restarts it
        certs = lifecycle.ship_config_files(cp, s)
        # m3_internal_tls: ExecStart starts with files/m3-tls-env
        certs += lifecycle.ship_scripts(s)
        unit_op, env_op = lifecycle.install_service(cp, s)
        if components.get(s.kind).lifecycle.activate == components.DRAINED and edges(cp):  # roles/edge.py
            started = restart_frontend(cp, s, unit_op, lifecycle.changes(s, unit_op, env_op, *certs))
        else:
            started = lifecycle.activate(s.unit, unit_op, lifecycle.changes(s, unit_op, env_op, *certs))
        lifecycle.wait_ready(s, started)
        if hostfiles.has_watchdog(s):
            _watchdog(cp, s)


def _watchdog(cp, s):
    """m3-frontend-watchdog.service restarts the frontend when its /live stops answering while the unit is active:
    after losing its etcd lease the frontend can hang in shutdown instead of exiting (files/m3-watchdog.py)."""
    name = hostfiles.watchdog_unit_name(s)
    script = lifecycle.ship_script(components.WATCHDOG)
    unit = hostops.ship(hostfiles.watchdog_unit(cp, s))
    lifecycle.activate(name, unit, [script, unit], tracked=False)
