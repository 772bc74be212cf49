"""Monitoring (m3_monitor): the exporters on every host and Prometheus on the monitor host, as the plan says
(m3deploy.core.monitor; docs/OBSERVE.md).

Reads (through m3deploy.deploy.context): cluster_plan() (targets, rules: hostfiles.prometheus_files);
host_plan().services of kinds node-exporter, nats-exporter, gpu-exporter, prometheus (argv, ports, workdir,
readiness, image). Settings behind them: m3_monitor, m3_prometheus_port, m3_node_exporter_port,
m3_nats_exporter_port, m3_monitor_scrape_interval_s, m3_prometheus_retention_time/_size, m3_alert_ttft_p99_s.

- node-exporter and Prometheus are Debian's packages (prometheus-node-exporter 1.5, prometheus 2.42 in bookworm),
  run by m3's own units (m3-node-exporter.service, m3-prometheus.service) on the cluster address. The packages'
  own units would listen on all addresses: they are stopped and masked BEFORE the install (as nats-server's).
- The NATS exporter is files/m3-nats-exporter.py (Debian 12 has no prometheus-nats-exporter), run as user nats.
- The GPU exporter (GPU hosts only) is the vendor's container (catalog.yaml vendors.<vendor>.metrics_exporter),
  pulled by roles/images.py with the host's other images.
- Prometheus's config and rules are checked with the package's own `promtool check config` before the restart
  they cause; readiness is Prometheus's /-/ready (polled from the controller, only when this run restarted it).
"""
from pyinfra.api import deploy
from pyinfra.operations import server

from m3deploy.core import monitor
from m3deploy.deploy import hostfiles
from roles import _units as u


@deploy("Deploy monitoring")
def deploy_monitor():
    cp, hp = u.plans()
    for s in hp.services:
        if s.kind not in monitor.KINDS:
            continue
        # a package's own unit masked before the package: its postinst would start it on all addresses
        u.install(monitor.PACKAGES.get(s.kind, ""), mask=hostfiles.monitor_mask(s))
        user = hostfiles.service_user(s)
        u.ensure_workdir(s, user)
        changed = []
        if s.kind == "nats-exporter":
            changed.append(u.ship(hostfiles.nats_exporter_script(), name=f"Ship {monitor.NATS_EXPORTER_SCRIPT}"))
        if s.kind == "prometheus":
            confs = [u.ship(f) for f in hostfiles.prometheus_files(cp)]
            changed += confs
            server.shell(name=f"Check {monitor.PROMETHEUS_CONF} and its rules (promtool)",
                         commands=[f"promtool check config {monitor.PROMETHEUS_CONF}"],
                         _if=lambda ops=tuple(confs): any(u._did_change(op) for op in ops))
        if s.env_file:  # a container's --env-file
            changed.append(u.ship(hostfiles.env_file(s, None)))
        unit_op = u.ship(hostfiles.unit_file(cp, s))
        started = u.activate(s.unit, unit_op, u.changes(s, unit_op, *changed))
        u.wait_ready(s, started)
