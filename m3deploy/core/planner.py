"""Dynamo's SLA planner carried out on bare metal (m3_planner; docs/PLANNER.md): pure plan data, no I/O.

With m3_planner the plan gives the first control host two more services:
- `m3-planner`: `python -m dynamo.planner --config PLANNER_CONF` (the 1.6.1 wheel's dynamo/planner/__main__.py:
  one `--config`, a JSON file or string validated by config/planner_config.py `PlannerConfig`) in
  `environment: virtual`: it publishes its decisions in etcd (`v1/<namespace>/planner/num_decode_workers`,
  `decision_id`; the runtime's rust/planner.rs) and scales nothing itself;
- `m3-planner-actuator` (files/m3-planner-actuator.py, run by the host's Dynamo venv): reads each decision with
  Dynamo's `VirtualConnectorClient`, clamps it to [min, max], waits out the cool-down, orders the prepared worker
  units of the `standby` hosts started or drained (GET /orders on m3_planner's `port`), waits until they are, then
  acknowledges it (`complete()`); it keeps the last decision it acted on, so a restart never acts on an older one;
and each standby host an `m3-standby-agent` (files/m3-standby-agent.py, root, stdlib python3) that polls those
orders and runs `systemctl start|stop` on its own planned worker units only.
Standby hosts are worker hosts (group `workers`) that are also in group `standby`: the deploy stages and installs
their worker units (`Service.standby`) but neither enables nor starts them, and the plan's `workers` (what verify
expects serving) leaves them out. Aggregated workers only: the planner's AggPlanner publishes an aggregated pool
as `num_decode_workers` (core/adapters.py); prefill/decode pools (m3_disagg) are refused for now (docs/PLANNER.md).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from m3deploy.core.inputs import url_host
from m3deploy.core.model import Port, Readiness, Service, WorkerPlan
from m3deploy.core.planner_settings import bounds, settings_of
from m3deploy.core.provenance import provenance

PLANNER_UNIT, ACTUATOR_UNIT = "m3-planner", "m3-planner-actuator"
PLANNER_CONF = "/etc/m3/planner.json"
ACTUATOR_CONF = "/etc/m3/planner-actuator.json"
ACTUATOR = "/usr/local/lib/m3/m3-planner-actuator.py"  # files/m3-planner-actuator.py
AGENT_UNIT, AGENT = "m3-standby-agent", "/usr/local/lib/m3/m3-standby-agent.py"  # files/m3-standby-agent.py
AGENT_CONF = "/etc/m3/standby-agent.json"
SCRIPTS = {"actuator": ("files/m3-planner-actuator.py", ACTUATOR),  # (project file, host path)
           "standby-agent": ("files/m3-standby-agent.py", AGENT)}
STANDBY_GROUP = "standby"
NAMESPACE = "dynamo"  # the namespace our workers register in (the mocker's and engines' DYN_NAMESPACE default)
PROFILE_DIR = "/etc/m3/planner-profile"  # on worker hosts: the mocker's --planner-profile-data
PROFILE_FILES = ("prefill_raw_data.json", "decode_raw_data.json")  # dynamo/planner/monitoring/perf_metrics.py
DEFAULT_PROFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "planner-profile")


def enabled(s: Mapping[str, Any]) -> bool:
    return bool(s.get("m3_planner")) and s.get("m3_serving") == "dynamo"


def profile_problem(s: Mapping[str, Any]) -> str:
    """m3_planner.profile_data must hold the two JSON files, each a JSON object ('' when fine)."""
    d = settings_of(s)["profile_data"]
    for f in PROFILE_FILES if d else ():
        try:
            with open(os.path.join(d, f)) as fh:
                if not isinstance(json.load(fh), dict):
                    raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            return (f"key m3_planner: profile_data {os.path.join(d, f)}: {e}. Fix: a directory with "
                    f"{' and '.join(PROFILE_FILES)} (scripts/make-planner-profile.py writes them)")
    return ""


def profile_files(s: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(host path, text) of the mocker's profile files (validate checked them: profile_problem)."""
    d = settings_of(s)["profile_data"]
    out = []
    for f in PROFILE_FILES if d else ():
        with open(os.path.join(d, f)) as fh:
            out.append((f"{PROFILE_DIR}/{f}", fh.read()))
    return tuple(out)


def problems(s: Mapping[str, Any], groups: Mapping[str, list[str]], disagg: bool) -> list[str]:
    """The planner's rules (validate.planner_settings); `groups`: group -> host names."""
    standby = groups.get(STANDBY_GROUP, [])
    if not s.get("m3_planner"):
        return [f"group {STANDBY_GROUP}: hosts {standby} are held in reserve only for the planner. Fix: set "
                "m3_planner = {...} (docs/PLANNER.md), or move them out of the group"] if standby else []
    out = []
    if s.get("m3_serving") != "dynamo" or not groups.get("control"):
        out.append("key m3_planner: Dynamo's planner runs on a control host. Fix: m3_serving = 'dynamo' with a "
                   "control group, or remove m3_planner")
    if disagg:
        out.append("key m3_planner: with m3_disagg the planner scales prefill and decode pools; standby hosts for "
                   "a pool are not supported yet (docs/PLANNER.md). Fix: aggregated workers, or remove m3_planner")
    if not standby:
        out.append(f"key m3_planner: no host in group {STANDBY_GROUP}, so there is nothing to scale. Fix: put one "
                   "or more worker hosts in group 'standby' (staged, not serving; docs/INVENTORY.md)")
    outside = [h for h in standby if h not in groups.get("workers", [])]
    if outside:
        out.append(f"group {STANDBY_GROUP}: {outside} not in group workers. Fix: a standby host is a worker host "
                   "held in reserve; add it to 'workers' too")
    p = settings_of(s)
    always_on = len([h for h in groups.get("workers", []) if h not in standby])
    lo, hi = bounds(p, always_on, len(standby))
    if lo > hi:
        out.append(f"key m3_planner: min {lo} > max {hi}. Fix: min <= max")
    if hi > always_on + len(standby):
        out.append(f"key m3_planner: max {hi} is more workers than the {always_on + len(standby)} hosts prepared "
                   "(workers + standby). Fix: lower max or add standby hosts")
    if lo < always_on:
        out.append(f"key m3_planner: min {lo} is fewer than the {always_on} workers outside standby, which always "
                   "serve (the actuator only starts and stops standby hosts). Fix: min >= "
                   f"{always_on}, or move hosts to 'standby'")
    if s.get("m3_engine") == "mocker" and profile_problem(s):
        out.append(profile_problem(s))
    if p["optimization_target"] == "sla" and not s.get("m3_monitor"):
        out.append("key m3_planner: optimization_target 'sla' reads the frontend's TTFT/ITL from Prometheus. Fix: "
                   "m3_monitor = True, or optimization_target 'throughput'")
    return out


def planner_config(p: Mapping[str, Any], lo: int, hi: int, backend: str, model: str,
                   prometheus: str) -> dict[str, Any]:
    """PlannerConfig's fields (the 1.6.1 wheel's config/planner_config.py), as PLANNER_CONF holds them."""
    conf = {
        "environment": "virtual", "backend": backend, "mode": "agg", "model_name": model,
        "optimization_target": p["optimization_target"], "ttft_ms": float(p["ttft_ms"]),
        "itl_ms": float(p["itl_ms"]), "load_adjustment_interval_seconds": int(p["interval_s"]),
        "min_endpoint": lo, "max_gpu_budget": hi, "decode_engine_num_gpu": 1,
        "pre_deployment_sweeping_mode": "none", "live_dashboard_port": 0, "control_api_port": 0,
        "metric_reporting_prometheus_port": 0,
    }
    if backend == "mocker" and p["profile_data"]:
        conf["profile_results_dir"] = PROFILE_DIR
    if p["optimization_target"] == "load":
        conf.update(decode_scale_up_kv_rate=float(p["scale_up_kv_pct"]),
                    decode_scale_down_kv_rate=float(p["scale_down_kv_pct"]))
    if p["optimization_target"] == "sla":
        conf.update(throughput_adjustment_interval_seconds=int(p["interval_s"]) * 6,
                    metric_pulling_prometheus_endpoint=prometheus)
    return conf


def standby_hosts(s: Mapping[str, Any], hosts: list) -> frozenset[str]:
    """The standby hosts' names (their workers are staged, not started), with m3_planner on."""
    return frozenset(h.name for h in hosts if STANDBY_GROUP in h.groups and "workers" in h.groups) \
        if enabled(s) else frozenset()


def services(c: Any, services: dict[str, list[Service]], worker_plans: list[WorkerPlan], hosts: list,
             addr: Mapping[str, str]) -> list[WorkerPlan]:
    """Add the planner and the actuator to the first control host and an agent to each standby host (new services;
    the standby workers were built standby: core.worker); return the planned workers without the standby ones
    (verify expects only those serving). `c`: the build's shared choices (core.build._Common)."""
    from m3deploy.core import control

    s = c.s
    groups = {g: [h.name for h in hosts if g in h.groups] for g in ("control", "workers", STANDBY_GROUP)}
    # m3_monitor's Prometheus: the `monitor` group's first host, else the first control host (core.monitor)
    mon = next((h for g in ("monitor", "control") for h in hosts if g in h.groups), None) if s.get("m3_monitor") \
        else None
    prometheus = f"http://{url_host(addr[mon.name])}:{s['m3_prometheus_port']}" if mon else ""
    standby = [h for h in groups.get(STANDBY_GROUP, []) if h in services]
    kept = [w for w in worker_plans if not set(w.hosts) & set(standby)]
    ctl = groups["control"][0]
    p = settings_of(s)
    lo, hi = bounds(p, len(kept), len(worker_plans) - len(kept))
    conf = planner_config(p, lo, hi, str(s.get("m3_engine")), c.served, prometheus)  # PlannerConfig.backend
    after = (f"{ctl}/m3-frontend",)
    planner = control.client_service(
        c, PLANNER_UNIT, "planner", ctl, addr[ctl], (f"{c.venv}/bin/python", "-m", "dynamo.planner", "--config",
                                                     PLANNER_CONF),
        readiness=Readiness(kind="process", timeout_s=120), after=after,
        files=((PLANNER_CONF, json.dumps(conf, indent=2, sort_keys=True) + "\n"),) + c.planner_profile,
        layer="feature:m3_planner", source="m3deploy/core/planner.py")
    actuator = _actuator(c, services, standby, addr, ctl, p, lo, hi, len(kept))
    services[ctl] += [planner, actuator] if p["planner"] == "local" else [replace(actuator, after=planner.after)]
    return kept


def _actuator(c: Any, services: dict[str, list[Service]], standby: list[str], addr: Mapping[str, str], ctl: str,
              p: Mapping[str, Any], lo: int, hi: int, always_on: int) -> Service:
    """The actuator on the first control host (its config: bounds, cool-down, each standby host's units and
    health URLs); each standby host's agent appended to its services."""
    from m3deploy.core import control

    home = c.home
    act_home = f"{home}/{ACTUATOR_UNIT}"
    conf_hosts = [{"host": h, "address": addr[h], "units": [x.name for x in services[h] if x.kind == "worker"],
                   "health": [f"http://{url_host(addr[h])}:{x.port('system').port}/health"
                              for x in services[h] if x.kind == "worker" and x.port("system")]} for h in standby]
    act_conf = {"namespace": NAMESPACE, "min": lo, "max": hi, "always_on": always_on, "cooldown_s": p["cooldown_s"],
                "standby": conf_hosts, "state_file": f"{act_home}/state.json", "ready_timeout_s": 300,
                "listen": addr[ctl], "port": int(p["port"])}
    orders_url = f"http://{url_host(addr[ctl])}:{int(p['port'])}/orders"
    for h in conf_hosts:
        agent = {"host": h["host"], "units": [f"{u}.service" for u in h["units"]], "orders": orders_url,
                 "interval_s": 2}
        services[h["host"]].append(Service(
            name=AGENT_UNIT, kind="standby-agent", host=h["host"], argv=("/usr/bin/python3", AGENT, "--config",
                                                                          AGENT_CONF),
            readiness=Readiness(kind="process", timeout_s=30), workdir=f"{home}/{AGENT_UNIT}",
            env_file=f"/etc/m3/{AGENT_UNIT}.env",
            files=((AGENT_CONF, json.dumps(agent, indent=2, sort_keys=True) + "\n"),),
            provenance=provenance(("--config", AGENT_CONF), (), "feature:m3_planner",
                                          "m3deploy/core/planner.py")))
    return control.client_service(
        c, ACTUATOR_UNIT, "actuator", ctl, addr[ctl], (f"{c.venv}/bin/python", ACTUATOR, "--config", ACTUATOR_CONF),
        readiness=Readiness(kind="process", timeout_s=60), after=(f"{ctl}/{PLANNER_UNIT}",),
        ports=(Port("orders", int(p["port"]), addr[ctl], key="m3_planner.port"),),
        files=((ACTUATOR_CONF, json.dumps(act_conf, indent=2, sort_keys=True) + "\n"),),
        layer="feature:m3_planner", source="m3deploy/core/planner.py")
