"""m3_planner's roles on pyinfra's `@fake` connector (roles/planner.py, roles/workers.py's standby branch): the control
host gets Dynamo's planner and the actuator (config files, the actuator script, units, 0600 env files with the
cluster's credentials, each started), a standby host gets its agent started and its worker unit staged, never
enabled or started; no secret is in an op name or command. The planner's decisions carried out for real:
tests/e2e/test_drills_planner.py (opt-in, `-m drills`)."""
from __future__ import annotations

from m3deploy.controller.secrets import load_secrets
from m3deploy.core import build, inventory, planner
from roles.planner import deploy_planner
from roles.workers import deploy_workers

SIM = {"m3_platform": "sim", "m3_parallel": "tp1", "m3_engine": "mocker", "m3_serving": "dynamo",
       "m3_planner": {"cooldown_s": 30}}


def _plan(tmp_path, monkeypatch):
    """1 control host, workers w1-w3, w3 also in `standby` (as tests/unit/test_planner.py)."""
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    workers = [(f"w{i}", {"m3_address": f"10.0.0.{i}"}) for i in (1, 2, 3)]
    groups = {"control": [("c1", {"m3_address": "10.0.0.99"})], "workers": workers, "standby": workers[2:]}
    return build.build(inventory.hosts_from_dict(groups, all_data=SIM), name="t")


def _names(run, host):
    return [o.name.split(" | ", 1)[-1] for o in run.for_host(host)]


def test_the_control_host_runs_the_planner_and_the_actuator(fake, tmp_path, monkeypatch):
    cp = _plan(tmp_path, monkeypatch)
    run = fake(deploy_planner, host_plan=cp.host("c1"), cluster_plan=cp)
    names = _names(run, "c1")
    for path in (planner.PLANNER_CONF, planner.ACTUATOR_CONF, planner.ACTUATOR):
        assert any(n in (f"Ship {path}", f"Render {path}") for n in names), (path, names)
    for unit in (planner.PLANNER_UNIT, planner.ACTUATOR_UNIT):
        assert f"Render /etc/systemd/system/{unit}.service" in names, names
        env = f"/etc/m3/{unit}.env"
        o = run.op(f"Deploy the planner, its actuator and the standby agents | Render {env}")
        up = o.commands.index(f"UPLOAD {env}")
        assert any(f"chmod 0600 {env}" in c for c in o.commands[:up]), o.commands  # 0600 before the content
        assert any(n.startswith(f"Restart {unit}.service") or n == f"Start {unit}.service" for n in names), names
    unit = run.op(f"Deploy the planner, its actuator and the standby agents | Render /etc/systemd/system/"
                  f"{planner.PLANNER_UNIT}.service").uploads[f"/etc/systemd/system/{planner.PLANNER_UNIT}.service"]
    assert f"-m dynamo.planner --config {planner.PLANNER_CONF}" in unit and "User=m3" in unit  # the m3 user
    assert not any(n.startswith("Ship /usr/local/lib/m3/m3-standby-agent") for n in names)  # the agent: standby only
    secrets = [v for v in load_secrets("t").values() if len(v) >= 8]
    for o in run.ops:
        assert not any(s in o.name or any(s in c for c in o.commands) for s in secrets), o.name


def test_a_standby_host_runs_its_agent_and_only_stages_its_worker(fake, tmp_path, monkeypatch):
    cp = _plan(tmp_path, monkeypatch)
    hp = cp.host("w3")
    agent = fake(deploy_planner, host_plan=hp, cluster_plan=cp)
    names = _names(agent, "w3")
    assert f"Ship {planner.AGENT}" in names and f"Ship {planner.AGENT_CONF}" in names, names
    assert f"Start {planner.AGENT_UNIT}.service" in names or any(
        n.startswith(f"Restart {planner.AGENT_UNIT}.service") for n in names), names
    assert not any(planner.PLANNER_UNIT + ".service" in n for n in names)

    workers = fake(deploy_workers, host_plan=hp, cluster_plan=cp)
    wnames = _names(workers, "w3")
    (w,) = [s for s in hp.services if s.kind == "worker"]
    assert w.standby and f"Render /etc/systemd/system/{w.unit}" in wnames, wnames
    assert f"Restart {w.unit} if the planner runs it (its files changed)" in wnames
    cmds = workers.commands
    assert not any(c.startswith(("systemctl enable", "systemctl start", "systemctl restart")) and w.unit in c
                   for c in cmds), cmds
    assert not any(n.startswith((f"Start {w.unit}", f"Wait for {w.unit}")) for n in wnames), wnames


def test_an_always_on_worker_is_started_as_before(fake, tmp_path, monkeypatch):
    cp = _plan(tmp_path, monkeypatch)
    names = _names(fake(deploy_workers, host_plan=cp.host("w1"), cluster_plan=cp), "w1")
    assert any(n.startswith("Wait for m3-worker@0.service") for n in names), names
    assert not any("if the planner runs it" in n for n in names)
