"""Observability, decided from the plan: which exporters run where, what Prometheus scrapes, the recording and
alert rules, and the Grafana dashboards (docs/OBSERVE.md). Pure: no I/O, no pyinfra.

With `m3_monitor` on, `add_services` (called once by m3deploy.core.build) gives
- every host Debian's `prometheus-node-exporter` (m3-node-exporter.service, port `m3_node_exporter_port`);
- every NATS host m3's own NATS exporter (files/m3-nats-exporter.py, port `m3_nats_exporter_port`): Debian 12 ships
  no prometheus-nats-exporter, and nats-server 2.9 serves JSON monitoring only (/varz), which Prometheus cannot
  scrape; the script republishes /varz's numbers under prometheus-nats-exporter's names (`gnatsd_varz_*`);
- every GPU host its vendor's exporter container (catalog.yaml `vendors.<vendor>.metrics_exporter`: NVIDIA's
  dcgm-exporter, AMD's device-metrics-exporter), published on the cluster address only;
- the monitor host (the first host of a `monitor` group, else the first control host, else the first host)
  Debian's `prometheus` (m3-prometheus.service) with retention bounded by `m3_prometheus_retention_time` and
  `m3_prometheus_retention_size`.
Every one of them listens on its host's cluster address, never on all addresses.

`targets(plan)` is the scrape list, read from the plan's services and ports (frontend HTTP /metrics, each Dynamo
worker's DYN_SYSTEM_PORT /metrics, a standalone engine's HTTP /metrics, etcd's client /metrics, the exporters);
`prometheus_config`, `rules` and `dashboards` render from it. The metric names are Dynamo 1.6.1's
(ai-dynamo-runtime 1.6.1 `dynamo/prometheus_names.py`, and the names a 1.6.1 frontend and mocker served on this
machine), etcd 3.4's, node-exporter 1.5's and the NATS exporter's; tests/e2e/test_monitor_testbed.py checks
every name a rule or dashboard uses against the live testbed's Prometheus.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from m3deploy.core import catalog, settings
from m3deploy.core.inputs import url_host
from m3deploy.core.model import ClusterPlan, HostPlan, Port, Readiness, Service
from m3deploy.core.provenance import launch_provenance, provenance

MONITOR_GROUP = "monitor"
PROMETHEUS, NODE_EXPORTER, NATS_EXPORTER, GPU_EXPORTER = (
    "m3-prometheus", "m3-node-exporter", "m3-nats-exporter", "m3-gpu-exporter")
PROMETHEUS_CONF = "/etc/m3/prometheus.yml"
PROMETHEUS_RULES = "/etc/m3/prometheus-rules.yml"
NATS_EXPORTER_SCRIPT = "/usr/local/lib/m3/m3-nats-exporter.py"

# ------------------------------------------------------------------------------------------- metric names
# Dynamo 1.6.1 (ai-dynamo-runtime 1.6.1: dynamo/prometheus_names.py; seen on a 1.6.1 frontend and mocker)
FE_REQUESTS = "dynamo_frontend_requests_total"  # labels model, endpoint, request_type, status, error_type
FE_INFLIGHT = "dynamo_frontend_inflight_requests"
FE_QUEUED = "dynamo_frontend_queued_requests"
FE_TTFT = "dynamo_frontend_time_to_first_token_seconds"  # histogram, label model
FE_ITL = "dynamo_frontend_inter_token_latency_seconds"
FE_ISL = "dynamo_frontend_input_sequence_tokens"
FE_OSL = "dynamo_frontend_output_sequence_tokens"
FE_MODEL_READY = "dynamo_frontend_model_ready"  # 1 when the frontend can route at least one request for the model
FE_MIGRATIONS = "dynamo_frontend_model_migration_total"  # appears with the first migration
WK_REQUESTS = "dynamo_component_requests_total"  # labels dynamo_endpoint, worker_id (hex)
WK_INFLIGHT = "dynamo_component_inflight_requests"
WK_DURATION = "dynamo_component_request_duration_seconds"
WK_TTFT = "dynamo_work_handler_time_to_first_response_seconds"  # the worker's own time to its first response
WK_UPTIME = "dynamo_component_uptime_seconds"
# etcd 3.4 (server/etcdserver/metrics.go)
ETCD_HAS_LEADER = "etcd_server_has_leader"
ETCD_LEADER_CHANGES = "etcd_server_leader_changes_seen_total"
# the NATS exporter (files/m3-nats-exporter.py; prometheus-nats-exporter's `gnatsd_varz_<field>` names)
NATS_SLOW_CONSUMERS = "gnatsd_varz_slow_consumers"
NATS_CONNECTIONS = "gnatsd_varz_connections"
# node-exporter 1.5
NODE_FS_AVAIL, NODE_FS_SIZE = "node_filesystem_avail_bytes", "node_filesystem_size_bytes"
NODE_MEM_AVAIL, NODE_MEM_TOTAL = "node_memory_MemAvailable_bytes", "node_memory_MemTotal_bytes"
NODE_CPU = "node_cpu_seconds_total"
# real filesystems only (the testbed's root is an overlay, which node-exporter leaves out by default)
REAL_FS = 'fstype!~"tmpfs|ramfs|overlay|squashfs|nsfs|fuse.*"'


@dataclass(frozen=True)
class Target:
    """One scrape target: a service's metrics port, with the labels every rule and panel groups by."""

    job: str  # frontend | worker | engine | etcd | nats | node | gpu | prometheus
    host: str
    service: str
    address: str  # host:port (IPv6 in brackets)
    path: str = "/metrics"
    worker: int = -1  # the plan's worker index (job worker/engine)
    pool: str = ""  # the worker's pool: agg, prefill, decode

    def labels(self) -> dict[str, str]:
        out = {"host": self.host, "service": self.service}
        if self.worker >= 0:
            out.update(worker=str(self.worker), pool=self.pool)
        return out


# ------------------------------------------------------------------------------------------- plan part

def monitor_host(hosts: Iterable) -> Any | None:
    """The host Prometheus runs on: the first of a `monitor` group, else the first control host, else the first."""
    hosts = list(hosts)
    for group in (MONITOR_GROUP, "control"):
        for h in hosts:
            if group in h.groups:
                return h
    return hosts[0] if hosts else None


def exporter_of(vendor: str) -> Mapping[str, Any]:
    """The vendor's GPU metrics exporter (catalog.yaml vendors.<vendor>.metrics_exporter), {} when none."""
    return (catalog.catalog().get("vendors", {}).get(vendor) or {}).get("metrics_exporter") or {}


def add_services(services: dict[str, list[Service]], hosts: list, s: Mapping[str, Any],
                 addr: Mapping[str, str]) -> None:
    """Append the monitoring services to `services` ({host: [Service]}, in start order) when m3_monitor is on."""
    if not s.get("m3_monitor"):
        return
    state_dir = s["m3_state_dir"]
    mon = monitor_host(hosts)
    for h in hosts:
        a = addr[h.name]
        u = url_host(a)
        port = int(s["m3_node_exporter_port"])
        services[h.name].append(_service(
            name=NODE_EXPORTER, kind="node-exporter", host=h.name,
            argv=("/usr/bin/prometheus-node-exporter", f"--web.listen-address={u}:{port}"),
            ports=(Port("metrics", port, a, key="m3_node_exporter_port"),),
            readiness=Readiness(kind="http", url=f"http://{u}:{port}/metrics", timeout_s=60)))
        nats = next((x for x in services[h.name] if x.kind == "nats"), None)
        if nats is not None:
            monitor_port = next(p.port for p in nats.ports if p.name == "monitor")
            port = int(s["m3_nats_exporter_port"])
            services[h.name].append(_service(
                name=NATS_EXPORTER, kind="nats-exporter", host=h.name,
                argv=("/usr/bin/python3", NATS_EXPORTER_SCRIPT, "--listen", f"{u}:{port}",
                      "--varz", f"http://{u}:{monitor_port}/varz"),
                ports=(Port("metrics", port, a, key="m3_nats_exporter_port"),), after=(f"{h.name}/nats",),
                readiness=Readiness(kind="http", url=f"http://{u}:{port}/metrics", timeout_s=60)))
        vendor = _gpu_vendor(h)
        exp = exporter_of(vendor) if vendor else {}
        if exp:
            port = int(exp["port"])
            fill = {"address": url_host(a), "port": port, "container_port": int(exp.get("container_port", port))}
            services[h.name].append(_service(
                name=GPU_EXPORTER, kind="gpu-exporter", host=h.name,
                argv=tuple(str(x).format(**fill) for x in exp["argv"]), image=str(exp["image"]),
                docker_args=tuple(str(x).format(**fill) for x in exp.get("docker", ())),
                ports=(Port("metrics", port, a),), env_file=f"/etc/m3/{GPU_EXPORTER}.env",
                readiness=Readiness(kind="http", url=f"http://{url_host(a)}:{port}/metrics", timeout_s=300)))
        if h is mon:
            port = int(s["m3_prometheus_port"])
            workdir = f"{state_dir}/prometheus"
            services[h.name].append(_service(
                name=PROMETHEUS, kind="prometheus", host=h.name,
                argv=("/usr/bin/prometheus", f"--config.file={PROMETHEUS_CONF}",
                      f"--storage.tsdb.path={workdir}/data",
                      f"--storage.tsdb.retention.time={s['m3_prometheus_retention_time']}",
                      f"--storage.tsdb.retention.size={s['m3_prometheus_retention_size']}",
                      f"--web.listen-address={u}:{port}"),
                ports=(Port("http", port, a, key="m3_prometheus_port"),), workdir=workdir,
                readiness=Readiness(kind="http", url=f"http://{u}:{port}/-/ready", timeout_s=120)))


def _service(**fields) -> Service:
    """A monitoring service, with the provenance of each of its flags (m3_monitor; the GPU exporter's from
    catalog.yaml)."""
    source = "m3deploy/core/data/catalog.yaml" if fields["kind"] == "gpu-exporter" else "m3deploy/core/monitor.py"
    argv = fields["argv"]
    return Service(**fields, provenance=launch_provenance(argv[:1], "feature:m3_monitor", source)
                   + provenance(argv, (), "feature:m3_monitor", source))


def _gpu_vendor(h) -> str:
    if "workers" not in h.groups:
        return ""
    plat = settings.get(h.data, "m3_platform")
    vendor = catalog.platform(plat).get("vendor", "") if plat else ""
    return vendor if vendor in ("nvidia", "amd") else ""


def restarts_expr(job: str, window: str = "1h") -> str:
    """Restarts of each worker over `window`: every process has its own instance id (label worker_id), so each
    start is a new uptime series; those seen in the window minus one, plus any reset within one series."""
    up = f'{WK_UPTIME}{{job="{job}"}}'
    return (f"(count by (host, service) (count_over_time({up}[{window}])) - 1) + "
            f"sum by (host, service) (resets({up}[{window}]))")


def prometheus_service(plan: ClusterPlan) -> tuple[HostPlan, Service] | None:
    return plan.first("prometheus")


def prometheus_url(plan: ClusterPlan, path: str = "") -> str:
    """Prometheus's base URL ('' when the plan has none)."""
    hs = prometheus_service(plan)
    if hs is None:
        return ""
    p = next(x for x in hs[1].ports if x.name == "http")
    return f"http://{url_host(p.address)}:{p.port}{path}"


def setting(plan: ClusterPlan, key: str):
    return settings.get(dict(plan.settings), key)


# ------------------------------------------------------------------------------------------- scrape targets
_JOBS = {("frontend", "http"): "frontend", ("worker", "system"): "worker", ("scripted", "system"): "worker",
         ("etcd", "client"): "etcd", ("nats-exporter", "metrics"): "nats", ("node-exporter", "metrics"): "node",
         ("gpu-exporter", "metrics"): "gpu", ("prometheus", "http"): "prometheus"}
JOBS = ("frontend", "worker", "engine", "etcd", "nats", "node", "gpu", "prometheus")


def pool_of(s: Service) -> str:
    """A worker's pool label: its pool (Service.pool: prefill, decode), else agg."""
    return s.pool or "agg"


def targets(plan: ClusterPlan) -> list[Target]:
    """Every scrape target of the plan, in host and service order."""
    out = []
    for h in plan.hosts:
        for s in h.services:
            for p in s.ports:
                job = _JOBS.get((s.kind, p.name))
                if s.kind == "etcd" and s.port("metrics"):  # m3_internal_tls: the client port wants a certificate
                    job = "etcd" if p.name == "metrics" else None
                if job is None and s.kind == "worker" and p.name == "http" and plan.serving == "standalone":
                    job = "engine"  # a standalone engine serves its own /metrics on its HTTP port
                # a standby worker (m3_planner) is down until the planner starts it: not a target (M3WorkerDown)
                if job is None or (s.kind == "worker" and (s.rank > 0 or s.standby)):
                    continue
                out.append(Target(job=job, host=h.name, service=s.name, address=f"{url_host(p.address)}:{p.port}",
                                  worker=s.worker if s.kind == "worker" else -1,
                                  pool=pool_of(s) if s.kind == "worker" else ""))
    return out


def prometheus_config(plan: ClusterPlan) -> dict:
    """prometheus.yml: one job per kind of target, one static target per service (labels host, service, and
    worker/pool for workers), the rules file."""
    interval = f"{int(setting(plan, 'm3_monitor_scrape_interval_s'))}s"
    jobs: dict[str, list[Target]] = {}
    for t in targets(plan):
        jobs.setdefault(t.job, []).append(t)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "external_labels": {"cluster": plan.name}},
        "rule_files": [PROMETHEUS_RULES],
        "scrape_configs": [
            {"job_name": job, "metrics_path": ts[0].path, "scrape_timeout": interval,
             "static_configs": [{"targets": [t.address], "labels": t.labels()} for t in ts]}
            for job in JOBS if (ts := jobs.get(job))],
    }


# ------------------------------------------------------------------------------------------- rules
def kv_usage_metric(plan: ClusterPlan) -> str:
    """The engine's KV cache usage gauge (0..1), engines.yaml `metrics.kv_usage` ('' when the engine has none)."""
    return str(((catalog.engines().get(plan.engine) or {}).get("metrics") or {}).get("kv_usage") or "")


_UNIT_S = {"s": 1, "m": 60, "h": 3600}
MIN_SAMPLES = 4  # a range vector spans at least this many scrape intervals (rate() needs 2 samples; 4 rides out a miss)


def window(plan: ClusterPlan, base: str) -> str:
    """A range window of the rules and dashboards: `base` (e.g. "1m"), or MIN_SAMPLES scrape intervals where that is
    longer, so that no rate() or increase() is empty at a long m3_monitor_scrape_interval_s (issue 35). The rule
    names keep their base ("rate1m": the short window)."""
    base_s = int(base[:-1]) * _UNIT_S[base[-1]]
    need = MIN_SAMPLES * int(setting(plan, "m3_monitor_scrape_interval_s"))
    return base if base_s >= need else f"{need}s"


def _q(plan: ClusterPlan, quantile: float, metric: str, by: str, base: str = "5m") -> str:
    return f"histogram_quantile({quantile}, sum by (le, {by}) (rate({metric}_bucket[{window(plan, base)}])))"


def recording_rules(plan: ClusterPlan) -> list[dict]:
    wk = 'job="worker"' if plan.serving == "dynamo" else 'job="engine"'
    w1 = window(plan, "1m")
    rules = []
    if any(t.job == "frontend" for t in targets(plan)):
        rules += [
            {"record": "m3:frontend_requests:rate1m", "expr": f"sum by (model) (rate({FE_REQUESTS}[{w1}]))"},
            {"record": "m3:frontend_errors:rate1m",
             "expr": f'sum by (model) (rate({FE_REQUESTS}{{status!="success"}}[{w1}]))'},
            {"record": "m3:frontend_ttft_seconds:p50", "expr": _q(plan, 0.5, FE_TTFT, "model")},
            {"record": "m3:frontend_ttft_seconds:p99", "expr": _q(plan, 0.99, FE_TTFT, "model")},
            {"record": "m3:frontend_itl_seconds:p99", "expr": _q(plan, 0.99, FE_ITL, "model")},
        ]
    if plan.serving == "dynamo" and plan.workers:
        rules += [
            {"record": "m3:worker_requests:rate1m",
             "expr": "sum by (host, service, worker, pool) "
                     f'(rate({WK_REQUESTS}{{{wk},dynamo_endpoint="generate"}}[{w1}]))'},
            {"record": "m3:worker_inflight",
             "expr": f'sum by (host, service, worker, pool) ({WK_INFLIGHT}{{{wk},dynamo_endpoint="generate"}})'},
            {"record": "m3:worker_ttft_seconds:p50", "expr": _q(plan, 0.5, WK_TTFT, "host, service, worker, pool")},
            {"record": "m3:worker_ttft_seconds:p99", "expr": _q(plan, 0.99, WK_TTFT, "host, service, worker, pool")},
        ]
    kv = kv_usage_metric(plan)
    if kv and plan.workers:
        rules.append({"record": "m3:worker_kv_usage:ratio",
                      "expr": f"max by (host, service, worker, pool) ({kv}{{{wk}}})"})
    rules += [
        {"record": "m3:host_memory_available:ratio", "expr": f"{NODE_MEM_AVAIL} / {NODE_MEM_TOTAL}"},
        {"record": "m3:host_filesystem_available:ratio",
         "expr": f"{NODE_FS_AVAIL}{{{REAL_FS}}} / {NODE_FS_SIZE}{{{REAL_FS}}}"},
    ]
    return rules


def alert_rules(plan: ClusterPlan) -> list[dict]:
    sla = float(setting(plan, "m3_alert_ttft_p99_s"))
    jobs = {t.job for t in targets(plan)}
    wk = "worker" if plan.serving == "dynamo" else "engine"

    def alert(name, expr, for_, severity, summary):
        return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
                "annotations": {"summary": summary}}

    out = [alert("M3TargetDown", "up == 0", "1m", "warning",
                 "{{ $labels.job }} target {{ $labels.host }}/{{ $labels.service }} is down")]
    if plan.workers:
        out.append(alert("M3WorkerDown", f'up{{job="{wk}"}} == 0', "30s", "critical",
                         "worker {{ $labels.worker }} ({{ $labels.host }}/{{ $labels.service }}) is down"))
    if "frontend" in jobs:
        out += [
            alert("M3NoRoutableWorker", f"max by (model) ({FE_MODEL_READY}) < 1 or "
                  f'absent({FE_MODEL_READY}{{job="frontend"}})', "1m", "critical",
                  "the frontend cannot route a request for {{ $labels.model }}: no routable worker"),
            alert("M3TimeToFirstTokenHigh", f"m3:frontend_ttft_seconds:p99 > {sla:g}", "5m", "warning",
                  f"time to first token p99 of {{{{ $labels.model }}}} is above the SLA ({sla:g} s, "
                  "m3_alert_ttft_p99_s)")]
    if kv_usage_metric(plan) and plan.workers:
        out.append(alert("M3KVCacheNearlyFull", "m3:worker_kv_usage:ratio > 0.9", "5m", "warning",
                         "KV cache of worker {{ $labels.worker }} ({{ $labels.host }}) is over 90 % used"))
    if "etcd" in jobs:
        w15 = window(plan, "15m")
        out += [alert("M3EtcdNoLeader", f"{ETCD_HAS_LEADER} == 0", "1m", "critical",
                      "etcd member {{ $labels.host }} has no leader"),
                alert("M3EtcdLeaderChanges", f"increase({ETCD_LEADER_CHANGES}[{w15}]) > 2", "0m", "warning",
                      f"etcd changed leader more than twice in {'15 minutes' if w15 == '15m' else w15}")]
    if "nats" in jobs:
        out.append(alert("M3NatsSlowConsumers", f"increase({NATS_SLOW_CONSUMERS}[{window(plan, '5m')}]) > 0", "0m",
                         "warning", "NATS on {{ $labels.host }} has slow consumers"))
    out += [alert("M3HostDiskNearlyFull", "m3:host_filesystem_available:ratio < 0.1", "10m", "warning",
                  "{{ $labels.mountpoint }} on {{ $labels.host }} is over 90 % full"),
            alert("M3HostMemoryNearlyFull", "m3:host_memory_available:ratio < 0.1", "5m", "warning",
                  "{{ $labels.host }} has less than 10 % memory available")]
    return out


def rules(plan: ClusterPlan) -> dict:
    """The rules file: a recording group and an alert group."""
    return {"groups": [{"name": "m3-recording", "rules": recording_rules(plan)},
                       {"name": "m3-alerts", "rules": alert_rules(plan)}]}


# ------------------------------------------------------------------------------------------- dashboards
def _panel(title: str, exprs: list[tuple[str, str]], unit: str = "short", w: int = 12, kind: str = "timeseries"):
    return {"type": kind, "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "gridPos": {"h": 8, "w": w},
            "targets": [{"refId": chr(65 + i), "expr": e, "legendFormat": leg,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, (e, leg) in enumerate(exprs)]}


def _var(name: str, values: list[str], label: str) -> dict:
    return {"type": "custom", "name": name, "label": label, "multi": True, "includeAll": True,
            "query": ",".join(values), "current": {"text": "All", "value": "$__all"},
            "options": [{"text": v, "value": v, "selected": False} for v in values]}


def _dashboard(plan: ClusterPlan, uid: str, title: str, panels: list[dict], variables: list[dict]) -> dict:
    y = x = 0
    for i, p in enumerate(panels):  # lay panels out left to right, 24 columns wide
        w = p["gridPos"]["w"]
        if x + w > 24:
            x, y = 0, y + 8
        p.update(id=i + 1, gridPos={**p["gridPos"], "x": x, "y": y})
        x += w
    ds = {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus",
          "current": {}, "hide": 0}
    return {"uid": uid[:40], "title": title, "tags": ["m3deploy", plan.name], "timezone": "utc",
            "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-30m", "to": "now"},
            "templating": {"list": [ds, *variables]}, "panels": panels,
            "description": f"Generated by m3deploy from the plan of cluster {plan.name}; regenerate, do not edit."}


def _overview_panels(plan: ClusterPlan, jobs: set[str]) -> list[dict]:
    """The overview dashboard's panels: the frontend's, etcd's and NATS's where the plan scrapes them."""
    w5, w1h = window(plan, "5m"), window(plan, "1h")
    over = [_panel("Up targets by job", [("sum by (job) (up)", "{{job}}")])]
    if "frontend" in jobs:
        over = [
            _panel("Requests/s", [("sum(m3:frontend_requests:rate1m)", "ok+errors"),
                                  ("sum(m3:frontend_errors:rate1m)", "errors")], "reqps"),
            _panel("Time to first token", [("m3:frontend_ttft_seconds:p50", "p50 {{model}}"),
                                           ("m3:frontend_ttft_seconds:p99", "p99 {{model}}")], "s"),
            _panel("In flight and queued", [(f"sum({FE_INFLIGHT})", "in flight"), (f"sum({FE_QUEUED})", "queued")]),
            _panel("Inter-token latency p99", [("m3:frontend_itl_seconds:p99", "{{model}}")], "s"),
            _panel("Sequence lengths (mean)", [
                (f"sum(rate({FE_ISL}_sum[{w5}])) / sum(rate({FE_ISL}_count[{w5}]))", "input"),
                (f"sum(rate({FE_OSL}_sum[{w5}])) / sum(rate({FE_OSL}_count[{w5}]))", "output")]),
            _panel("Model ready", [(f"max by (model) ({FE_MODEL_READY})", "{{model}}")], w=6, kind="stat"),
            *over]
    if "etcd" in jobs:
        over.append(_panel("etcd leader", [(f"max by (host) ({ETCD_HAS_LEADER})", "{{host}} has leader"),
                                           (f"sum(increase({ETCD_LEADER_CHANGES}[{w1h}]))", "leader changes 1h")], w=6))
    if "nats" in jobs:
        over.append(_panel("NATS", [(f"sum by (host) ({NATS_CONNECTIONS})", "connections {{host}}"),
                                    (f"sum by (host) ({NATS_SLOW_CONSUMERS})", "slow consumers {{host}}")], w=6))
    return over


def _host_panels(plan: ClusterPlan) -> list[dict]:
    """The hosts dashboard's panels: node exporter, and each GPU vendor's exporter."""
    hsel = '{host=~"$host"}'
    idle = f'{NODE_CPU}{{mode="idle",host=~"$host"}}'
    hp = [_panel("CPU busy", [(f'1 - avg by (host) (rate({idle}[{window(plan, "1m")}]))', "{{host}}")], "percentunit"),
          _panel("Memory available", [(f"m3:host_memory_available:ratio{hsel}", "{{host}}")], "percentunit"),
          _panel("Filesystem available", [(f"m3:host_filesystem_available:ratio{hsel}", "{{host}} {{mountpoint}}")],
                 "percentunit")]
    for vendor in sorted({h.gpu_vendor for h in plan.hosts if h.gpu_vendor}):
        for title, metric, unit in exporter_of(vendor).get("panels", ()):
            hp.append(_panel(f"{vendor.upper()} {title}", [(f"{metric}{hsel}", "{{host}} {{gpu}}")], unit))
    return hp


def dashboards(plan: ClusterPlan) -> dict[str, dict]:
    """{file name: Grafana dashboard JSON} for the cluster: overview (frontend, alerts), workers (per worker and
    pool), hosts (node and GPU exporters). Variables list the plan's own hosts, workers and pools."""
    ts = targets(plan)
    jobs = {t.job for t in ts}
    wk = "worker" if plan.serving == "dynamo" else "engine"
    hosts = [h.name for h in plan.hosts]
    workers = sorted({str(t.worker) for t in ts if t.worker >= 0}, key=int)
    pools = sorted({t.pool for t in ts if t.worker >= 0})
    out = {}
    over = _overview_panels(plan, jobs)
    out[f"m3-{plan.name}-overview.json"] = _dashboard(plan, f"m3-{plan.name}-overview", f"m3 {plan.name}: overview",
                                                      over, [])
    if workers:
        sel = f'{{job="{wk}",worker=~"$worker",pool=~"$pool"}}'
        rsel = '{worker=~"$worker",pool=~"$pool"}'
        panels = []
        if plan.serving == "dynamo":
            panels += [
                _panel("Requests/s per worker", [(f"m3:worker_requests:rate1m{rsel}", "{{worker}} {{host}}")], "reqps"),
                _panel("In flight per worker", [(f"m3:worker_inflight{rsel}", "{{worker}} {{host}}")]),
                _panel("Time to first response p50/p99 per worker",
                       [(f"m3:worker_ttft_seconds:p50{rsel}", "p50 {{worker}}"),
                        (f"m3:worker_ttft_seconds:p99{rsel}", "p99 {{worker}}")], "s"),
                _panel("Requests/s per pool", [(f"sum by (pool) (m3:worker_requests:rate1m{rsel})", "{{pool}}")],
                       "reqps")]
        if kv_usage_metric(plan):
            panels.append(_panel("KV cache usage per worker", [(f"m3:worker_kv_usage:ratio{rsel}", "{{worker}}")],
                                 "percentunit"))
        panels += [_panel("Worker up", [(f"up{sel}", "{{worker}} {{host}}/{{service}}")], w=12),
                   _panel("Restarts (process uptime)", [(f"{WK_UPTIME}{sel}", "{{worker}}")], "s")
                   if plan.serving == "dynamo" else _panel("Scrape duration", [(f"scrape_duration_seconds{sel}",
                                                                                "{{worker}}")], "s")]
        out[f"m3-{plan.name}-workers.json"] = _dashboard(
            plan, f"m3-{plan.name}-workers", f"m3 {plan.name}: workers", panels,
            [_var("worker", workers, "worker"), _var("pool", pools, "pool")])
    hp = _host_panels(plan)
    out[f"m3-{plan.name}-hosts.json"] = _dashboard(plan, f"m3-{plan.name}-hosts", f"m3 {plan.name}: hosts", hp,
                                                   [_var("host", hosts, "host")])
    return out


# ------------------------------------------------------------------------------------------- metric names used
_FUNCS = {"sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "absent", "by",
          "without", "on", "ignoring", "group_left", "group_right", "or", "and", "unless", "scalar", "vector",
          "bool", "topk", "bottomk", "le", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, ranges, strings and grouping lists removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        tok = m.group(0)
        if tok in _FUNCS or re.fullmatch(r"[0-9.e]+", tok) or e[m.end():].lstrip().startswith("("):
            continue
        names.add(tok)
    return names


def used_metrics(plan: ClusterPlan) -> dict[str, set[str]]:
    """{metric name: where it is used} over every rule and dashboard panel; recorded names (m3:*) are left out:
    `recorded_names` says which rules make them."""
    uses: dict[str, set[str]] = {}
    exprs = [(f"rule {r.get('record') or r.get('alert')}", r["expr"])
             for g in rules(plan)["groups"] for r in g["rules"]]
    for fname, d in dashboards(plan).items():
        exprs += [(f"{fname}: {p['title']}", t["expr"]) for p in d["panels"] for t in p["targets"]]
    for where, expr in exprs:
        for n in metric_names(expr):
            if not n.startswith("m3:"):
                uses.setdefault(n, set()).add(where)
    return uses


def recorded_names(plan: ClusterPlan) -> set[str]:
    return {r["record"] for g in rules(plan)["groups"] for r in g["rules"] if "record" in r}


def to_yaml(doc: Any) -> str:
    """YAML for prometheus.yml and the rules (JSON is YAML; sorted keys, one line per key, readable)."""
    import yaml

    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)


def dashboard_json(doc: dict) -> str:
    return json.dumps(doc, indent=2) + "\n"
