"""The component registry drives a new service kind (issue 33; docs/ARCHITECTURE.md "Adding a service"): a toy
Alertmanager, declared only by its entry in m3deploy.core.components (monkeypatched in) and carried by a plan, gets
its package's unit masked, its package installed, its config file, its unit from the monitoring template as the
registry's user, its place in the manifest and teardown, and its role and stage in deploy.py, with no other change:
hostfiles, the roles, deploy.py and the architecture test read the registry. What a real one adds besides the entry:
the Service built in core/monitor.py, its settings key, a template if none fits, docs."""
from __future__ import annotations

from dataclasses import replace

import pytest

from m3deploy.core import build, components, inventory
from m3deploy.core.model import Port, Readiness, Service
from m3deploy.deploy import hostfiles
from roles.monitor import deploy_monitor

SIM = {"m3_platform": "sim", "m3_parallel": "tp1", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_monitor": True}
CONF = "/etc/m3/alertmanager.yml"
ALERTMANAGER = components.Component(
    "alertmanager", "roles.monitor.deploy_monitor", components.MONITOR, "m3-monitor.service.j2",
    packages=("prometheus-alertmanager",), package_unit="prometheus-alertmanager.service", user="prometheus",
    unit_vars=("description", "package_unit"), description="Alertmanager", checks=("unit", "port", "health"))


@pytest.fixture
def plan(tmp_path, monkeypatch):
    """The registry with the toy entry, and a plan whose control host carries its Service (as core/monitor.py would
    build it)."""
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    monkeypatch.setattr(components, "COMPONENTS", components.COMPONENTS + (ALERTMANAGER,))
    groups = {"control": [("c1", {"m3_address": "10.0.0.9"})], "workers": [("w1", {"m3_address": "10.0.0.1"})]}
    cp = build.build(inventory.hosts_from_dict(groups, all_data=SIM), name="t")
    am = Service(name="m3-alertmanager", kind="alertmanager", host="c1",
                 argv=("/usr/bin/prometheus-alertmanager", f"--config.file={CONF}",
                       "--web.listen-address=10.0.0.9:9093"),
                 ports=(Port("http", 9093, "10.0.0.9"),),
                 readiness=Readiness(kind="http", url="http://10.0.0.9:9093/-/ready", timeout_s=60),
                 workdir="/var/lib/m3/m3-alertmanager", files=((CONF, "route:\n  receiver: none\n"),))
    c1 = cp.host("c1")
    return replace(cp, hosts=tuple(replace(h, services=h.services + (am,)) if h is c1 else h for h in cp.hosts))


def test_its_host_files_come_from_the_registry(plan):
    files = {f.path: f for f in hostfiles.host_files(plan, plan.host("c1"))}
    mask = files["/etc/systemd/system/prometheus-alertmanager.service"]
    assert mask.link == "/dev/null"
    paths = list(files)
    assert paths.index(mask.path) < paths.index(CONF) < paths.index("/etc/systemd/system/m3-alertmanager.service")
    unit = files["/etc/systemd/system/m3-alertmanager.service"].text
    assert "User=prometheus" in unit and "Description=Alertmanager (m3deploy cluster t)" in unit
    assert "The Debian package's prometheus-alertmanager.service is masked" in unit
    assert "ExecStart=/usr/bin/prometheus-alertmanager --config.file=/etc/m3/alertmanager.yml" in unit


def test_the_manifest_and_teardown_name_it(plan):
    m = hostfiles.manifest(plan, plan.host("c1"))
    assert m["packages"][-1] == "prometheus-alertmanager" and "m3-alertmanager.service" in m["units"]
    assert "/etc/systemd/system/prometheus-alertmanager.service" in m["links"] and CONF in m["files"]
    assert hostfiles.removal_problem("packages", "prometheus-alertmanager") == ""
    assert "prometheus-alertmanager" not in hostfiles.manifest(plan, plan.host("w1"))["packages"]


def test_deploy_py_runs_its_role_in_its_stage(plan):
    assert "roles.monitor.deploy_monitor" in components.roles(components.MONITOR)
    assert "alertmanager" in components.kinds("roles.monitor.deploy_monitor")


def test_its_role_installs_configures_and_activates_it(fake, plan):
    run = fake(deploy_monitor, host_plan=plan.host("c1"), cluster_plan=plan)
    names = [n.split(" | ", 1)[-1] for n in run.names]
    mine = [n for n in names if "alertmanager" in n]
    assert mine == ["Stop the package's prometheus-alertmanager.service",
                    "Mask prometheus-alertmanager.service",
                    "Reload systemd (prometheus-alertmanager.service masked)",
                    "Install prometheus-alertmanager",
                    "Ensure /var/lib/m3/m3-alertmanager",
                    f"Ship {CONF}",
                    "Render /etc/systemd/system/m3-alertmanager.service",
                    "Check m3-alertmanager.service runs its current files",
                    "Reload systemd (unit m3-alertmanager.service changed)",
                    "Restart m3-alertmanager.service (its files changed)",
                    "Start m3-alertmanager.service",
                    "Wait for m3-alertmanager.service (GET http://10.0.0.9:9093/-/ready answers 200)"]
    workdir = run.op("Deploy monitoring | Ensure /var/lib/m3/m3-alertmanager")
    assert "chown prometheus:prometheus" in workdir.commands[0]
