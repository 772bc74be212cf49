"""Dynamo's planner carried out (m3_planner; m3deploy.core.planner, docs/PLANNER.md).

Reads (through m3deploy.deploy.context): host_plan().services of kind "planner", "actuator" (the first control
host: `python -m dynamo.planner --config /etc/m3/planner.json` and files/m3-planner-actuator.py, both by the
Dynamo venv, as user m3, with the cluster's etcd/NATS credentials in their 0600 env files) and "standby-agent"
(each standby host: files/m3-standby-agent.py, root, which starts and stops only that host's planned worker
units). Each ships its config files and script, then is restarted when one of them changed, else started.
Runs after the serving check: the planner starts against a cluster that serves.
"""
from pyinfra.api import deploy

from m3deploy.core import internal_tls, planner
from m3deploy.deploy import hostfiles
from roles import _units as u


@deploy("Deploy the planner, its actuator and the standby agents")
def deploy_planner():
    cp, hp = u.plans()
    svcs = [x for x in hp.services if x.kind in planner.KINDS]
    # the scripts first, each once (one call site per script: pyinfra orders ops by call site across hosts)
    scripts = {k: u.ship(hostfiles.project_file(*planner.SCRIPTS[k]), name=f"Ship {planner.SCRIPTS[k][1]}")
               for k in planner.SCRIPTS if any(x.kind == k for x in svcs)}
    if any(internal_tls.launcher(x) for x in svcs):
        scripts["tls"] = u.ship(hostfiles.tls_launcher(), name=f"Ship {internal_tls.LAUNCHER}")
    for s in svcs:
        if hostfiles.service_user(s) == hostfiles.M3_USER:
            u.ensure_m3_user()
        u.ensure_workdir(s, hostfiles.service_user(s))
        ops = [u.ship(f, name=f"Ship {f.path}") for f in hostfiles.config_files(s, u.secrets_for(cp))]
        ops += [op for k, op in scripts.items() if k == s.kind or (k == "tls" and internal_tls.launcher(s))]
        unit_op, env_op = u.install_service(cp, s)
        u.wait_ready(s, u.activate(s.unit, unit_op, u.changes(s, unit_op, env_op, *ops), tracked=False))
