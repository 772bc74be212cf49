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

from m3deploy.core import components
from m3deploy.deploy import hostfiles
from roles import hostops, lifecycle


@deploy("Deploy monitoring")
def deploy_monitor():
    cp, hp = lifecycle.plans()
    for s in lifecycle.role_services(hp, __name__):
        c = components.get(s.kind)
        # a package's own unit masked before the package: its postinst would start it on all addresses
        lifecycle.install(s.kind)
        lifecycle.ensure_workdir(s, hostfiles.service_user(s))
        changed = lifecycle.ship_scripts(s)  # the NATS exporter's
        if c.config:  # prometheus.yml and its rules, checked by the package's own tool before the restart
            confs = [hostops.ship(f) for f in hostfiles.CONFIGS[c.config](cp, s)]
            changed += confs
            if c.config_check:
                what, command = c.config_check
                server.shell(name=f"Check {what}", commands=[command],
                             _if=lambda ops=tuple(confs): any(lifecycle.did_change(op) for op in ops))
        # the config files its command names (Service.files), as every service's
        changed += lifecycle.ship_config_files(cp, s)
        if s.env_file:  # a container's --env-file
            changed.append(hostops.ship(hostfiles.env_file(s, None)))
        unit_op = hostops.ship(hostfiles.unit_file(cp, s))
        started = lifecycle.activate(s.unit, unit_op, lifecycle.changes(s, unit_op, *changed))
        lifecycle.wait_ready(s, started)
