"""deploy.py with m3_monitor on (the shipped gb200 inventory: 1 control host, GPU trays), on pyinfra's `@fake`
connector as in test_deploy_py.py: the packages' own units are masked before their install, every monitoring
unit listens on its host's cluster address, Prometheus's files are the plan's and are checked by promtool before
the restart they cause, GPU hosts run the vendor's exporter container, and teardown removes all of it.
Contracts: Debian bookworm's prometheus 2.42 / prometheus-node-exporter 1.5 ship prometheus.service /
prometheus-node-exporter.service listening on all addresses (:9090, :9100), started by their postinst."""
from __future__ import annotations

import pytest
from test_deploy_py import (  # noqa: F401
    ROOT,
    Cluster,
    assert_role_order,
    controller,
    dynamo_ready,
    op,
)

from m3deploy.core import build as planmod
from m3deploy.core import inventory, monitor
from m3deploy.deploy import hostfiles


def MonitorCluster(**data) -> Cluster:
    override = {"m3_monitor": True, **data}
    c = Cluster("gb200", override_data=override)
    c.plan = planmod.build(inventory.load_inventory(ROOT / "inventories" / "gb200.py", override_data=override),
                           name="gb200")
    return c


@pytest.fixture
def mon(dynamo_ready):  # noqa: F811
    c = MonitorCluster()
    return c, c.run(state="fresh")


def _idx(ops, name: str) -> int:
    return next(i for i, o in enumerate(ops) if any(n.split(" | ", 1)[-1] == name for n in o.names))


def test_monitoring_is_deployed_on_every_host_after_the_serving_check(mon):
    cluster, run = mon
    assert run.error is None, run.error
    assert_role_order(run, cluster)
    prom_host = monitor.prometheus_service(cluster.plan)[0]
    assert "control" in prom_host.groups
    for name, ops in run.ops_by_host.items():
        hp = cluster.plan.host(name)
        # the package's unit is masked (and stopped) before the package is installed
        assert _idx(ops, "Mask prometheus-node-exporter.service") < _idx(ops, "Install prometheus-node-exporter")
        unit = next(o.uploads[p] for o in ops for p in o.uploads if p.endswith("/m3-node-exporter.service"))
        assert f"--web.listen-address={hp.address}:9100" in unit and "User=prometheus" in unit
        if hp.gpus:
            gpu = next(o.uploads[p] for o in ops for p in o.uploads if p.endswith("/m3-gpu-exporter.service"))
            image = monitor.exporter_of(hp.gpu_vendor)["image"]
            assert image in gpu and f"-p {hp.address}:9400:9400" in gpu
            assert any(image in c for o in ops for c in o.commands), "the exporter image is pulled"
    ops = run.for_host(prom_host.name)
    assert _idx(ops, "Mask prometheus.service") < _idx(ops, "Install prometheus")
    conf = op(ops, f"Render {monitor.PROMETHEUS_CONF}").uploads[monitor.PROMETHEUS_CONF]
    assert conf == monitor.to_yaml(monitor.prometheus_config(cluster.plan))
    check = _idx(ops, f"Check {monitor.PROMETHEUS_CONF} and its rules (promtool)")
    assert _idx(ops, f"Render {monitor.PROMETHEUS_RULES}") < check < _idx(ops, "Restart m3-prometheus.service (its files changed)")
    assert "promtool check config /etc/m3/prometheus.yml" in ops[check].commands
    unit = next(o.uploads[p] for o in ops for p in o.uploads if p.endswith("/m3-prometheus.service"))
    assert f"--web.listen-address={prom_host.address}:9190" in unit and "0.0.0.0" not in unit


def test_teardown_removes_the_monitoring(dynamo_ready):  # noqa: F811
    cluster = MonitorCluster(m3_state="absent")
    run = cluster.run()
    assert run.error is None, run.error
    h, _ = monitor.prometheus_service(cluster.plan)
    m = hostfiles.manifest(cluster.plan, h)
    ops = run.for_host(h.name)
    names = {n.split(" | ", 1)[-1] for o in ops for n in o.names}
    stop = "\n".join(op(ops, "Stop and disable the m3 units").commands)
    for unit in ("m3-prometheus.service", "m3-node-exporter.service", "m3-nats-exporter.service"):
        assert unit in m["units"] and unit in stop
    for path in (monitor.PROMETHEUS_CONF, monitor.PROMETHEUS_RULES, monitor.NATS_EXPORTER_SCRIPT,
                 "/etc/systemd/system/m3-prometheus.service"):
        assert path in m["files"] and f"Remove {path}" in names
    for mask in ("/etc/systemd/system/prometheus.service", "/etc/systemd/system/prometheus-node-exporter.service"):
        assert mask in m["links"] and f"Remove {mask}" in names
    assert any(n.startswith("Remove ") and "prometheus-node-exporter" in n and "prometheus," in n for n in names)
    assert f"Remove {monitor.prometheus_service(cluster.plan)[1].workdir}" in names
