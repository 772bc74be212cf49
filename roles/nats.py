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
from roles import _units as u

USER = "nats"  # created by the nats-server package


@deploy("Deploy NATS")
def deploy_nats():
    cp, hp = u.plans()
    for s in u.services(hp, "nats"):
        conf = hostfiles.nats_conf(cp, s)
        # the package's unit masked BEFORE installing, so its postinst cannot start it on 0.0.0.0:4222
        u.install("nats-server", mask=hostfiles.nats_mask())
        u.ensure_workdir(s, USER)
        # m3_internal_tls: its certificate, key and the cluster CA (0600 nats), before the conf that names them
        certs = [u.ship(f, name=f"Ship {f.path}") for f in hostfiles.config_files(s, u.secrets_for(cp))]
        conf_op = u.ship(conf)
        unit_op, env_op = u.install_service(cp, s)
        started = u.activate(s.unit, unit_op, u.changes(s, unit_op, env_op, conf_op, *certs))
        u.wait_ready(s, started)
