"""m3_planner (m3deploy/core/planner.py, docs/PLANNER.md): the plan, its refusals, and the actuator's decisions.

Contracts read from the ai-dynamo 1.6.1 wheel (dynamo/planner/...):
- __main__.py `_parse_config`: the planner's only flag is `--config` (a JSON/YAML file or JSON string);
- config/planner_config.py `PlannerConfig`: its fields (PLANNER_FIELDS below, every annotated field of the class)
  and Literal values (environment, backend, mode, optimization_target, pre_deployment_sweeping_mode);
- the mocker's `--planner-profile-data` (dynamo/mocker/args.py) is in tests/fixtures/engine-flags (engine_contract);
  the profile directory's JSON keys: monitoring/perf_metrics.py `_convert_prefill_profiling` /
  `_convert_decode_profiling`;
- the decision the actuator reads: rust/planner.rs of ai-dynamo-runtime 1.6.1 (PlannerDecision: num_prefill_workers,
  num_decode_workers, decision_id; -1 = not set), the agg planner's pool = the decode role (core/adapters.py
  AggPlanner: require_decode).
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest
from engine_contract import plan_problems

from m3deploy.core import build, inventory, planner
from m3deploy.core.errors import ValidationError
from m3deploy.deploy import hostfiles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = {"m3_platform": "sim", "m3_parallel": "tp1", "m3_engine": "mocker", "m3_serving": "dynamo"}
# every annotated field of PlannerConfig in the 1.6.1 wheel's dynamo/planner/config/planner_config.py
PLANNER_FIELDS = {
    "advisory", "aic_interpolation", "ais_perf_model", "backend", "control_api_port", "decode_engine_num_gpu",
    "decode_min_endpoint", "decode_scale_down_kv_rate", "decode_scale_up_kv_rate", "enable_load_scaling",
    "enable_power_awareness", "enable_throughput_scaling", "environment", "fpm_sample_bucket_size",
    "global_planner_namespace", "itl_ms", "kalman_min_points", "kalman_q_level", "kalman_q_trend", "kalman_r",
    "live_dashboard_port", "load_adjustment_interval_seconds", "load_min_observations", "load_predictor",
    "load_predictor_log1p", "load_predictor_warmup_trace", "load_scaling_down_sensitivity", "log_dir",
    "max_gpu_budget", "max_num_fpm_samples", "max_throughput_scaling_replicas", "metric_pulling_prometheus_ca_bundle",
    "metric_pulling_prometheus_endpoint", "metric_pulling_prometheus_extra_query_params",
    "metric_pulling_prometheus_request_timeout_seconds", "metric_pulling_prometheus_ssl_verify",
    "metric_pulling_prometheus_token", "metric_pulling_prometheus_token_file", "metric_reporting_prometheus_port",
    "min_endpoint", "min_gpu_budget", "mode", "model_name", "namespace", "optimization_target", "plugin_registration",
    "pre_deployment_sweeping_mode", "prefill_engine_num_gpu", "prefill_min_endpoint",
    "prefill_scale_down_queue_tokens", "prefill_scale_up_queue_tokens", "profile_results_dir", "prophet_window_size",
    "report_filename", "report_interval_hours", "report_output_dir", "report_write_gzip_log", "scheduling",
    "speculative_nextn", "throughput_adjustment_interval_seconds", "throughput_metrics_source",
    "total_gpu_power_limit", "ttft_ms"}
LITERALS = {"environment": {"kubernetes", "virtual", "global-planner"},
            "backend": {"vllm", "sglang", "trtllm", "mocker"}, "mode": {"disagg", "prefill", "decode", "agg"},
            "optimization_target": {"throughput", "latency", "load", "sla"},
            "pre_deployment_sweeping_mode": {"none", "rapid", "thorough"}}


def _hosts(n: int, standby: int, data: dict):
    workers = [(f"w{i}", {"m3_address": f"10.0.0.{i}"}) for i in range(1, n + 1)]
    groups = {"control": [("c1", {"m3_address": "10.0.0.99"})], "workers": workers}
    if standby:
        groups["standby"] = workers[n - standby:]
    return inventory.hosts_from_dict(groups, all_data=data)


def _plan(n=3, standby=1, **p):
    return build.build(_hosts(n, standby, {**SIM, "m3_planner": p or {"cooldown_s": 30}}), name="t")


def _problems(n=3, standby=1, data=None) -> list[str]:
    with pytest.raises(ValidationError) as e:
        build.build(_hosts(n, standby, {**SIM, **(data or {})}), name="t")
    return list(e.value.problems)


def _conf(plan, host, path):
    return json.loads(dict(plan.host(host).service(
        {"planner": planner.PLANNER_UNIT, "actuator": planner.ACTUATOR_UNIT, "agent": planner.AGENT_UNIT}[path[0]]
    ).files)[path[1]])


def test_standby_workers_are_staged_not_planned_to_serve():
    plan = _plan()
    assert [w.hosts for w in plan.workers] == [("w1",), ("w2",)]  # verify expects these serving, not w3
    w3 = [s for s in plan.host("w3").services if s.kind == "worker"]
    assert w3 and all(s.standby for s in w3)
    assert not any(s.standby for h in ("w1", "w2") for s in plan.host(h).services)
    assert [s.kind for s in plan.host("w3").services if s.kind.startswith("standby")] == ["standby-agent"]
    assert plan_problems(plan) == []  # every worker flag (--planner-profile-data too) is one the wheel declares


def test_the_planner_runs_in_virtual_mode_with_a_valid_config():
    plan = _plan(ttft_ms=300, itl_ms=20, interval_s=5)
    svc = plan.host("c1").service(planner.PLANNER_UNIT)
    assert svc.argv[1:] == ("-m", "dynamo.planner", "--config", planner.PLANNER_CONF)  # __main__.py: --config only
    assert svc.argv[0] == f"{plan.venv}/bin/python"
    conf = _conf(plan, "c1", ("planner", planner.PLANNER_CONF))
    assert set(conf) <= PLANNER_FIELDS, set(conf) - PLANNER_FIELDS
    for k, allowed in LITERALS.items():
        assert k not in conf or conf[k] in allowed, (k, conf[k])
    assert (conf["environment"], conf["mode"], conf["backend"]) == ("virtual", "agg", "mocker")
    assert (conf["ttft_ms"], conf["itl_ms"], conf["load_adjustment_interval_seconds"]) == (300, 20, 5)
    assert conf["min_endpoint"] == 2 and conf["max_gpu_budget"] == 3
    assert conf["model_name"] == plan.served_model_name
    env = dict(svc.env)
    assert env["ETCD_ENDPOINTS"] == plan.etcd_endpoints and "ETCD_AUTH_PASSWORD" in dict(svc.secret_env)
    assert "ETCD_AUTH_PASSWORD" not in env  # secrets only in the 0600 env file, never argv or the plan


def test_load_target_sets_the_wheels_kv_thresholds():
    plan = _plan(optimization_target="load", scale_up_kv_pct=2.5, scale_down_kv_pct=0.5)
    conf = _conf(plan, "c1", ("planner", planner.PLANNER_CONF))
    assert (conf["optimization_target"], conf["decode_scale_up_kv_rate"], conf["decode_scale_down_kv_rate"]) == (
        "load", 2.5, 0.5)  # planner_config.py _validate_config: agg + load needs both, up > down
    assert set(conf) <= PLANNER_FIELDS


def test_the_actuator_knows_bounds_cooldown_and_the_standby_hosts():
    plan = _plan(min=2, max=3, cooldown_s=45, port=9187)
    conf = _conf(plan, "c1", ("actuator", planner.ACTUATOR_CONF))
    assert (conf["min"], conf["max"], conf["always_on"], conf["cooldown_s"]) == (2, 3, 2, 45)
    assert conf["namespace"] == "dynamo"
    assert conf["standby"] == [{"host": "w3", "address": "10.0.0.3", "units": ["m3-worker@0"],
                                "health": ["http://10.0.0.3:9090/health"]}]
    assert conf["state_file"].startswith(plan.host("c1").service(planner.ACTUATOR_UNIT).workdir + "/")
    agent = _conf(plan, "w3", ("agent", planner.AGENT_CONF))
    assert agent == {"host": "w3", "units": ["m3-worker@0.service"], "orders": "http://10.0.0.99:9187/orders",
                     "interval_s": 2}


def test_the_mocker_profile_is_shipped_with_the_keys_the_wheel_reads():
    assert not any("--planner-profile-data" in s.argv for h in _plan().hosts for s in h.services)  # opt-in
    plan = _plan(profile_data=planner.DEFAULT_PROFILE)
    assert plan_problems(plan) == []
    for h in ("w1", "w3"):
        w = next(s for s in plan.host(h).services if s.kind == "worker")
        i = w.argv.index("--planner-profile-data")
        assert w.argv[i + 1] == planner.PROFILE_DIR
        files = dict(w.files)
        pre = json.loads(files[f"{planner.PROFILE_DIR}/prefill_raw_data.json"])
        dec = json.loads(files[f"{planner.PROFILE_DIR}/decode_raw_data.json"])
        assert {"prefill_isl", "prefill_ttft"} <= set(pre) and len(pre["prefill_isl"]) == len(pre["prefill_ttft"])
        assert {"x_kv_usage", "y_context_length", "z_itl", "max_kv_tokens"} <= set(dec)
        assert len(dec["x_kv_usage"]) == len(dec["y_context_length"]) == len(dec["z_itl"]) > 0


def test_an_external_planner_leaves_only_the_actuator_and_agents():
    plan = _plan(planner="external")
    kinds = [s.kind for s in plan.host("c1").services]
    assert "planner" not in kinds and "actuator" in kinds
    assert plan.host("c1").service(planner.ACTUATOR_UNIT).after == ("c1/m3-frontend",)
    assert "standby-agent" in [s.kind for s in plan.host("w3").services]


def test_units_render_the_plans_argv():
    plan = _plan()
    for host, name in (("c1", planner.PLANNER_UNIT), ("c1", planner.ACTUATOR_UNIT), ("w3", planner.AGENT_UNIT)):
        s = plan.host(host).service(name)
        text = hostfiles.unit_file(plan, s).text
        assert f"ExecStart={s.argv[0]} " in text and f"EnvironmentFile={s.env_file}" in text
        assert f"User={'root' if s.kind == 'standby-agent' else 'm3'}" in text
    files = {f.path for f in hostfiles.host_files(plan, plan.host("c1"))}
    assert {planner.ACTUATOR, planner.PLANNER_CONF, planner.ACTUATOR_CONF} <= files
    assert planner.AGENT in {f.path for f in hostfiles.host_files(plan, plan.host("w3"))}
    # teardown removes them (the manifest names the units and files)
    m = hostfiles.manifest(plan, plan.host("c1"))
    assert {f"{planner.PLANNER_UNIT}.service", f"{planner.ACTUATOR_UNIT}.service"} <= set(m["units"])


@pytest.mark.parametrize("data, n, standby, why", [
    ({"m3_planner": {"max": 3}}, 3, 0, "no host in group standby"),
    ({"m3_planner": {"min": 3, "max": 2}}, 3, 1, "min 3 > max 2"),
    ({"m3_planner": {"max": 5}}, 3, 1, "max 5 is more workers than the 3 hosts prepared"),
    ({"m3_planner": {"min": 1}}, 3, 1, "min 1 is fewer than the 2 workers outside standby"),
    ({"m3_planner": {"optimization_target": "sla"}}, 3, 1, "optimization_target 'sla' reads"),
    ({"m3_planner": {"cooldown": 3}}, 3, 1, "unknown key(s) ['cooldown']"),
    ({"m3_planner": {"max": "3"}}, 3, 1, "max = '3' is not a int"),
    ({"m3_planner": {"port": 80}}, 3, 1, "port = 80 is not a TCP port"),
    ({"m3_planner": {"planner": "remote"}}, 3, 1, "planner = 'remote' is not 'local' or 'external'"),
    ({"m3_planner": {"optimization_target": "fast"}}, 3, 1, "is not one of throughput, latency, load, sla"),
    ({"m3_planner": {"optimization_target": "load", "scale_up_kv_pct": 10}}, 3, 1, "needs scale_up_kv_pct >"),
    ({"m3_planner": {"optimization_target": "load", "scale_up_kv_pct": 5, "scale_down_kv_pct": 9}}, 3, 1,
     "needs scale_up_kv_pct > scale_down_kv_pct"),
    ({"m3_planner": {"scale_up_kv_pct": 50}}, 3, 1, "apply only to optimization_target 'load'"),
    ({"m3_planner": {"optimization_target": "load", "scale_up_kv_pct": 150, "scale_down_kv_pct": 9}}, 3, 1,
     "is above 100"),
    ({"m3_planner": {"profile_data": "/nonexistent"}}, 3, 1, "profile_data /nonexistent/prefill_raw_data.json"),
    ({"m3_planner": {"max": 3}, "m3_disagg": {"prefill": {"workers": 1}, "decode": {"workers": 1}}}, 3, 1,
     "standby hosts for a pool are not supported"),
    ({}, 3, 1, "hosts ['w3'] are held in reserve only for the planner"),
    ({"m3_planner": {"aisimulate": "numpy"}}, 3, 1, "is not a pip requirement of the aisimulate package"),
    ({"m3_planner": {"aisimulate": "aisimulate; rm -rf /"}}, 3, 1, "is not a pip requirement of the aisimulate"),
])
def test_bad_settings_are_refused_with_the_fix(data, n, standby, why):
    found = _problems(n, standby, data)
    assert any(why in p for p in found), found
    assert all("Fix" in p for p in found if why in p)


def test_a_standby_host_outside_workers_is_refused():
    hosts = inventory.hosts_from_dict({"control": [("c1", {"m3_address": "10.0.0.99"})],
                                       "workers": [("w1", {"m3_address": "10.0.0.1"})],
                                       "standby": [("s1", {"m3_address": "10.0.0.5"})]},
                                      all_data={**SIM, "m3_planner": {"cooldown_s": 30}})
    with pytest.raises(ValidationError) as e:
        build.build(hosts, name="t")
    assert any("['s1'] not in group workers" in p for p in e.value.problems), e.value.problems


# ------------------------------------------------------------------------------ the actuator (files/...)

def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


act = _load("m3_planner_actuator", "files/m3-planner-actuator.py")
agent = _load("m3_standby_agent", "files/m3-standby-agent.py")
CONF = {"min": 1, "max": 3, "always_on": 1, "cooldown_s": 60,
        "standby": [{"host": "s1", "units": ["m3-worker@0"], "health": []},
                    {"host": "s2", "units": ["m3-worker@0"], "health": []}]}


@pytest.mark.parametrize("decision, state, now, want", [
    ((-1, -1), {}, 0, ("none", 0)),  # the planner has not decided yet
    ((2, 0), {}, 1000, ("scale", 1)),  # 2 workers: 1 always on + 1 standby
    ((9, 1), {"acted_id": 0}, 1000, ("scale", 2)),  # above max 3: clamped to 3 = 1 + both standby
    ((0, 2), {"acted_id": 1, "active": 2, "last_action_t": 0}, 1000, ("scale", 0)),  # below min 1: clamped
    ((3, 4), {"acted_id": 4, "active": 0}, 1000, ("stale", 0)),  # already handled: never again (actuator restart)
    ((3, 0), {"acted_id": 4, "active": 0}, 1000, ("scale", 2)),  # ids restarted: a new planner's first decision
    ((2, 5), {"acted_id": 4, "active": 1, "last_action_t": 990}, 1000, ("ack", 1)),  # as now: ack, even in cool-down
    ((3, 5), {"acted_id": 4, "active": 1, "last_action_t": 990}, 1000, ("wait", 2)),  # cool-down: 50 s left
    ((3, 5), {"acted_id": 4, "active": 1, "last_action_t": 939}, 1000, ("scale", 2)),  # cool-down over
])
def test_decide(decision, state, now, want):
    verb, n, why = act.decide(decision, state, CONF, now)
    assert (verb, n) == want, why


def test_steps_start_next_and_stop_last_started_first():
    s = CONF["standby"]
    assert act.steps(0, 2, s) == [("start", s[0]), ("start", s[1])]
    assert act.steps(2, 0, s) == [("stop", s[1]), ("stop", s[0])]
    assert act.steps(1, 1, s) == []


def test_state_survives_a_restart(tmp_path):
    path = str(tmp_path / "state.json")
    assert act.load_state(path) == {}  # first start
    act.save_state(path, {"acted_id": 7, "active": 1, "last_action_t": 5.0})
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    state = act.load_state(path)
    assert act.decide((3, 7), state, CONF, 1e9)[0] == "stale"  # after a restart: decision 7 is not redone
    (tmp_path / "bad.json").write_text("{not json")
    assert act.load_state(str(tmp_path / "bad.json")) == {}


def test_orders_and_the_agents_reading_of_them():
    assert act.orders(CONF["standby"], 1) == {"s1": True, "s2": False}
    assert agent.wanted({"hosts": act.orders(CONF["standby"], 2)}, "s2") is True
    for doc in (None, [], {"hosts": []}, {"hosts": {"s2": "yes"}}, {"hosts": {}}):
        assert agent.wanted(doc, "s2") is None  # no valid order: the agent changes nothing


def test_verify_expects_a_standby_worker_installed_and_not_enabled():
    from test_verify_unit import _by_id, _ctx

    from m3deploy.check import verify

    plan = _plan()
    checks = verify.host_checks(plan) + verify.controller_checks(plan)
    ids = {c.id for c in checks}
    assert "unit/w3/m3-worker@0" in ids and "unit/w3/m3-standby-agent" in ids
    assert not any(i.startswith(("port/w3/m3-worker", "health/w3/m3-worker")) for i in ids)  # not serving: no port
    assert "port/w1/m3-worker@0/system" in ids  # the always-on worker is checked as before
    show = "LoadState=loaded\nActiveState={}\nSubState=x\nUnitFileState={}\nNRestarts=0\n"
    for active, enabled, ok in (("inactive", "disabled", True), ("active", "disabled", True),  # scaled out
                                ("inactive", "enabled", False)):
        r = verify.run_check(_by_id(checks, "unit/w3/m3-worker@0"), _ctx(plan, {"w3": {
            "systemctl show": (0, show.format(active, enabled)), "journalctl": (0, "")}}))
        assert r.ok is ok, (active, enabled, r.evidence)


def test_an_idle_standby_worker_is_no_scrape_target():
    from m3deploy.core import monitor

    plan = build.build(_hosts(3, 1, {**SIM, "m3_planner": {"cooldown_s": 30}, "m3_monitor": True}), name="t")
    workers = {(t.host, t.service) for t in monitor.targets(plan) if t.job == "worker"}
    assert ("w1", "m3-worker@0") in workers and ("w3", "m3-worker@0") not in workers  # no M3WorkerDown while idle


def test_only_the_planners_host_gets_the_planners_imports():
    """Dynamo's planner imports what ai-dynamo 1.6.1's requirements leave out (found by starting it on the testbed):
    the host that runs it gets a wheelhouse with them (its own cache directory), every other host the usual one."""
    from m3deploy.controller import artifacts

    plan = _plan(aisimulate="aisimulate==0.13.0.dev202610270000000085")
    ctl = artifacts.host_target(plan, plan.host("c1"))
    assert ctl.extra == ("aisimulate==0.13.0.dev202610270000000085", "scikit-learn", "prometheus-api-client",
                         "pmdarima", "filterpy", "prophet")
    assert ctl.suffix.startswith("-cp311-x86_64-planner-") and ctl.python == artifacts.HOSTS.python
    assert all(artifacts.host_target(plan, plan.host(w)) == artifacts.HOSTS for w in ("w1", "w2", "w3"))
    assert artifacts.host_target(_plan(), _plan().host("c1")).extra[0] == "aisimulate==0.13.0"  # ai-dynamo's pin
    ext = _plan(planner="external")
    assert all(artifacts.host_target(ext, h) == artifacts.HOSTS for h in ext.hosts)  # no planner process here
