"""NATS (JetStream on, raised max_payload, user/password auth) for Dynamo, on the cluster address.

Reads (through m3deploy.deploy.context): cluster_plan().name and .nats (max_payload, from m3_nats_max_payload,
default 33554432: long prompts time out below it, Dynamo issue 9734; the NATS cluster's name); host_plan().services of
kind "nats": argv (`nats-server -c CONF`), ports "client" and "monitor", env
(NATS_AUTH_USERNAME), secret_env (NATS_AUTH_PASSWORD), env_file, workdir (JetStream store under
it), readiness.

nats.conf holds no secret: it names $NATS_AUTH_USERNAME/$NATS_AUTH_PASSWORD, which nats-server
resolves from its environment (the 0600 EnvironmentFile). The package's nats-server.service is
stopped and masked (it would bind 0.0.0.0:4222). With 3 control hosts the plan gives each NATS a "cluster"
port: nats.conf then makes it one node of a cluster (routes to every node, the same user for routes,
JetStream clustered; docs/OPERATIONS.md "HA control plane").
"""
from pyinfra.api import deploy

from m3deploy.deploy import hostfiles
from roles import hostops, lifecycle


@deploy("Deploy NATS")
def deploy_nats():
    cp, hp = lifecycle.plans()
    for s in lifecycle.role_services(hp, __name__):
        conf = hostfiles.nats_conf(cp, s)
        # the package's unit masked BEFORE installing, so its postinst cannot start it on 0.0.0.0:4222
        lifecycle.install(s.kind)
        lifecycle.ensure_workdir(s, hostfiles.service_user(s))
        # m3_internal_tls: its certificate, key and the cluster CA (0600 nats), before the conf that names them
        certs = lifecycle.ship_config_files(cp, s)
        conf_op = hostops.ship(conf)
        unit_op, env_op = lifecycle.install_service(cp, s)
        started = lifecycle.activate(s.unit, unit_op, lifecycle.changes(s, unit_op, env_op, conf_op, *certs))
        lifecycle.wait_ready(s, started)
