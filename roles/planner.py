"""Dynamo's planner carried out (m3_planner; m3deploy.core.planner, docs/PLANNER.md).

Reads (through m3deploy.deploy.context): host_plan().services of kind "planner", "actuator" (the first control
host: `python -m dynamo.planner --config /etc/m3/planner.json` and files/m3-planner-actuator.py, both by the
Dynamo venv, as user m3, with the cluster's etcd/NATS credentials in their 0600 env files) and "standby-agent"
(each standby host: files/m3-standby-agent.py, root, which starts and stops only that host's planned worker
units). Each ships its config files and script, then is restarted when one of them changed, else started.
Runs after the serving check: the planner starts against a cluster that serves.
"""
from pyinfra.api import deploy

from m3deploy.core import components
from m3deploy.deploy import hostfiles
from roles import lifecycle


@deploy("Deploy the planner, its actuator and the standby agents")
def deploy_planner():
    cp, hp = lifecycle.plans()
    svcs = lifecycle.role_services(hp, __name__)  # the planner, the actuator, a standby agent
    tls = components.TLS_LAUNCHER
    # the scripts first, each once (one call site per script: pyinfra orders ops by call site across hosts): the
    # actuator's and the agent's, then the TLS launcher (m3_internal_tls: the Dynamo clients' ExecStart starts with it)
    kinds = {x.kind for x in svcs}
    own = [x for c in components.all_components() if c.kind in kinds for x in c.scripts if x != tls]
    scripts = {x: lifecycle.ship_script(x) for x in dict.fromkeys(own)}
    if any(hostfiles.needs(x, tls) for x in svcs):
        scripts[tls] = lifecycle.ship_script(tls)
    for s in svcs:
        if hostfiles.service_user(s) == hostfiles.M3_USER:
            lifecycle.ensure_m3_user()
        lifecycle.ensure_workdir(s, hostfiles.service_user(s))
        ops = lifecycle.ship_config_files(cp, s)
        ops += [op for x, op in scripts.items() if hostfiles.needs(s, x)]
        unit_op, env_op = lifecycle.install_service(cp, s)
        started = lifecycle.activate(s.unit, unit_op, lifecycle.changes(s, unit_op, env_op, *ops),
                                     tracked=components.get(s.kind).lifecycle.tracked)
        lifecycle.wait_ready(s, started)
