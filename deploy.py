"""pyinfra entry point: `pyinfra -y inventories/<cluster>.py deploy.py`.

Builds and validates the cluster plan before any operation (an invalid plan stops the run with every
problem listed, and no host is changed), then calls the roles in order for the current host's groups.
Ordering and gating only: flags, env and images come from the plan; install steps live in roles/.

Order: preflight -> apt's retry setting -> drivers -> container runtime -> the host's manifest
(/etc/m3/manifest.json: what teardown removes) -> artifacts -> images -> weights -> the control plane's components
(etcd, NATS healthy, frontend live, edge, keepalived) -> workers (healthy, rank 0 first) -> the cluster's address
held by one control host (m3_vip) -> frontend lists every worker -> a real request -> the planner (m3_planner) ->
monitoring (m3_monitor: exporters, Prometheus ready) -> the deploy record (~/.config/m3deploy/<cluster>/deployed.json:
what actually runs). The components' roles, their order and the hosts they run on come from the component registry
(m3deploy/core/components.py: each stage's roles in the order of their first component, on a host that runs one
of its kinds).
pyinfra only orders a host's own ops; ops of hosts with different op lists run side by side (its op DAG
advances every host's chain together: a tray's worker unit would start while the control host is still
installing etcd). So `_all_hosts_reach()` adds one op shared by every host (same call site = same op)
before the workers and before the serving check: nothing after it starts until every host is there.

Teardown: `pyinfra -y inventories/<cluster>.py deploy.py --data m3_state=absent`
(`--data m3_keep_caches=true` keeps the venv, wheelhouse and weights). A host that the deploy record lists but the
inventory does not is never touched here (a warning names it): `m3deploy prune` drains and tears it down (prune.py).
"""
from importlib import import_module

from pyinfra import host

from m3deploy.core import components
from m3deploy.core.errors import M3Error, ValidationError
from m3deploy.deploy.context import InvalidPlan, cluster_plan, host_plan
from roles.failfast import stop_on_unreachable_or_failed_hosts

# an unreachable host stops the run before any change; a host failing mid-deploy stops it after that operation
stop_on_unreachable_or_failed_hosts()

try:
    plan = cluster_plan()  # and, once, every controller artifact the hosts need (m3deploy.controller.prepare)
except ValidationError as e:
    # pyinfra prints it once (not once per host), without a traceback, and exits 2 before any operation
    raise InvalidPlan(f"invalid cluster plan, nothing was changed:\n{e}") from None
except M3Error as e:
    raise InvalidPlan(f"the controller could not prepare the deploy, nothing was changed:\n{e}") from None

from roles.apt import configure_apt  # noqa: E402
from roles.artifacts import deploy_artifacts  # noqa: E402
from roles.drivers import deploy_drivers  # noqa: E402
from roles.images import deploy_images  # noqa: E402
from roles.manifest import write_manifest  # noqa: E402
from roles.preflight import preflight  # noqa: E402
from roles.record import record_deployment  # noqa: E402
from roles.rolling import roll_workers  # noqa: E402
from roles.runtime import deploy_runtime  # noqa: E402
from roles.serving import verify_serving  # noqa: E402
from roles.teardown import teardown  # noqa: E402
from roles.vip import wait_vip  # noqa: E402
from roles.weights import deploy_weights  # noqa: E402

hp = host_plan()
kinds = {s.kind for s in hp.services}


def _all_hosts_reach(phase: str):
    """A cluster-wide barrier: one command-less op on every host, from one call site, so no host runs a later
    phase before every host finished the earlier ones (tests/deploy/test_deploy_py.py)."""
    from roles.hostops import barrier

    barrier(name=f"Every host has reached: {phase}")


def _deploy(stage: str):
    """The components' roles of one stage, in the registry's order, each on a host that runs one of its kinds.
    host.loop gives each role its own place in pyinfra's op order (all of a stage's roles are called from one line)."""
    for role in host.loop(components.roles(stage)):
        if kinds & set(components.kinds(role)):
            module, function = role.rsplit(".", 1)
            getattr(import_module(module), function)()


if plan.state == "absent":
    teardown()
else:
    preflight()
    configure_apt()  # before any apt operation: retries without the delay that can hang apt (files/m3-apt.conf)
    containers = any(s.image for s in hp.services)  # GPU engines; mocker workers with m3_runtime=docker
    if hp.gpus:
        deploy_drivers()
    if hp.gpus or containers:
        deploy_runtime()
    write_manifest()  # what teardown removes (/etc/m3/manifest.json), before anything it names is made
    deploy_artifacts()
    if hp.gpus or containers:
        deploy_images()
    if hp.weights_dir:  # GPU hosts; testbed hosts when the plan stages mock repos (m3_mock_repo_mb)
        deploy_weights()
    _deploy(components.CONTROL)  # etcd, NATS, the frontend, the edge (m3_edge), keepalived (m3_vip)
    _all_hosts_reach("control services and GPU hosts ready")
    _deploy(components.WORKERS)
    _all_hosts_reach("worker units written")
    roll_workers()  # one op on one host: restarts the changed workers in turn (roles/rolling.py)
    _all_hosts_reach("workers started")
    wait_vip()  # m3_vip: held by exactly one control host (the endpoint's owner asks them), before the endpoint is used
    if "frontend" in kinds or (plan.serving == "standalone" and "worker" in kinds):
        verify_serving()
    _deploy(components.PLANNER)  # m3_planner: the planner, its actuator, the standby agents
    _deploy(components.MONITOR)  # m3_monitor: exporters on every host, Prometheus on the monitor host
    record_deployment()
