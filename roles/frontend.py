"""The Dynamo frontend (OpenAI HTTP + KV router), native from the versioned venv.

Reads (through m3deploy.deploy.context): cluster_plan().name; host_plan().services of kind "frontend":
argv/command, env (ETCD_ENDPOINTS, NATS_SERVER, DYN_* advertised addresses, HOME, ...),
secret_env (ETCD_AUTH_PASSWORD, NATS_AUTH_PASSWORD), env_file, workdir, readiness.
Runs as system user m3 (root only when the plan gives it a container image).
Needs deploy_artifacts() first (venv) and etcd/NATS ready.
"""
from pyinfra.api import deploy

from roles import _units as u


@deploy("Deploy the Dynamo frontend")
def deploy_frontend():
    cp, hp = u.plans()
    for s in u.services(hp, "frontend"):
        user = "root" if s.image else u.M3_USER
        if not s.image:
            u.ensure_m3_user()
        u.ensure_workdir(s, user)
        unit_op, env_op = u.install_service(cp, s, "m3-frontend.service.j2", user)
        started = u.start_or_restart(s, unit_op, [unit_op, env_op])
        u.wait_ready(s, started)
