"""m3_monitor (m3deploy.core.monitor): exporters and Prometheus in the plan, scrape targets, rules and dashboards
generated from it, every listener on the cluster address; the names the rules use are Dynamo 1.6.1's own."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from m3deploy.check.status import quantile_from_buckets
from m3deploy.core import components, monitor
from m3deploy.core.build import build
from m3deploy.core.errors import ValidationError
from m3deploy.core.inventory import load_inventory
from m3deploy.deploy import hostfiles

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "metrics"


def plan(inv: str = "h200", **data):
    return build(load_inventory(REPO / "inventories" / f"{inv}.py", override_data=data), name=inv)


def names(f: str) -> set[str]:
    return {x.strip() for x in (FIX / f).read_text().splitlines() if x.strip() and not x.startswith("#")}


def test_off_by_default_and_no_monitoring_service_without_it():
    p = plan()
    assert not [s for h in p.hosts for s in h.services if components.get(s.kind).stage == "monitoring"]
    assert monitor.prometheus_url(p) == ""


@pytest.mark.parametrize("inv", ["h200", "mi300x", "gb200"])  # standalone (no control host), standalone, Dynamo
def test_exporters_on_every_host_prometheus_on_the_first_control_host_all_on_cluster_addresses(inv):
    p = plan(inv, m3_monitor=True)
    mon = next(h for h in p.hosts if "control" in h.groups) if p.group("control") else p.hosts[0]
    for h in p.hosts:
        kinds = [s.kind for s in h.services]
        assert "node-exporter" in kinds, h.name
        assert ("prometheus" in kinds) == (h is mon), h.name
        assert ("gpu-exporter" in kinds) == bool(h.gpus), h.name
        assert ("nats-exporter" in kinds) == ("nats" in kinds), h.name
        for s in h.services:
            for port in s.ports:
                assert port.address == h.address, (h.name, s.name, port)
            if s.kind == "gpu-exporter":  # published on the cluster address only, the vendor's image
                assert f"{monitor.url_host(h.address)}:{port.port}:" in " ".join(s.docker_args)
                assert s.image == monitor.exporter_of(h.gpu_vendor)["image"]


def test_a_monitor_group_takes_prometheus(tmp_path):
    inv = tmp_path / "gb200.py"  # the file-named group takes group_data/gb200.py
    inv.write_text((REPO / "inventories" / "gb200.py").read_text() + "\nmonitor = [workers[-1]]\n")
    gd = REPO / "group_data"
    (tmp_path / "group_data").symlink_to(gd)
    p = build(load_inventory(inv, override_data={"m3_monitor": True}), name="gb200")
    hosts = [h.name for h in p.hosts if any(s.kind == "prometheus" for s in h.services)]
    assert hosts == [next(h.name for h in p.hosts if "monitor" in h.groups)]


def test_scrape_targets_are_the_plans_metrics_ports():
    p = plan("gb200", m3_monitor=True)
    conf = monitor.prometheus_config(p)
    got = {(j["job_name"], t) for j in conf["scrape_configs"] for sc in j["static_configs"] for t in sc["targets"]}
    want = set()
    for h in p.hosts:
        for s in h.services:
            ports = {x.name: x.port for x in s.ports}
            if s.kind == "frontend":
                want.add(("frontend", f"{h.address}:{ports['http']}"))
            if s.kind == "worker" and s.rank == 0:
                want.add(("worker", f"{h.address}:{ports['system']}"))  # DYN_SYSTEM_PORT
                assert dict(s.env)["DYN_SYSTEM_PORT"] == str(ports["system"])
            if s.kind == "etcd":
                want.add(("etcd", f"{h.address}:{ports['client']}"))
    assert want <= got
    assert {j for j, _ in got} >= {"frontend", "worker", "etcd", "nats", "node", "gpu", "prometheus"}
    assert conf["rule_files"] == [monitor.PROMETHEUS_RULES]


def test_retention_bounds_reach_prometheus_and_bad_ones_are_refused():
    p = plan(m3_monitor=True, m3_prometheus_retention_time="30d", m3_prometheus_retention_size="50GB")
    argv = monitor.prometheus_service(p)[1].argv
    assert "--storage.tsdb.retention.time=30d" in argv and "--storage.tsdb.retention.size=50GB" in argv
    with pytest.raises(ValidationError) as e:
        plan(m3_monitor=True, m3_prometheus_retention_size="lots")
    assert "m3_prometheus_retention_size" in str(e.value) and "10GB" in str(e.value)


def test_the_rules_and_dashboards_use_only_names_a_dynamo_161_frontend_and_mocker_serve():
    """Offline half of the contract (the live half: tests/e2e/test_monitor_testbed.py): every Dynamo or engine
    name a rule or panel of the testbed's plan reads is one a 1.6.1 frontend or mocker served here."""
    served = names("dynamo-1.6.1-frontend.txt") | names("dynamo-1.6.1-mocker.txt")
    p = plan("gb200", m3_monitor=True, m3_engine="mocker", m3_platform="sim", m3_parallel="tp1",
             m3_variant="bf16", m3_features=[])  # gb200's eagle3-gqa and text-only are vLLM's: refused on the mocker
    used = monitor.used_metrics(p)
    dynamo = {n for n in used if n.startswith(("dynamo_", "vllm:"))}
    assert dynamo, used
    missing = {n: sorted(used[n]) for n in dynamo if n not in served}
    assert not missing
    recorded = monitor.recorded_names(p)
    for g in monitor.rules(p)["groups"]:
        for r in g["rules"]:
            for n in monitor.metric_names(r["expr"]):
                assert not n.startswith("m3:") or n in recorded, (r, n)


def test_metric_names_ignores_labels_functions_and_grouping():
    e = 'histogram_quantile(0.99, sum by (le, model) (rate(a_b_bucket{job="x",le!="1"}[5m]))) / on(x) vllm:kv or up'
    assert monitor.metric_names(e) == {"a_b_bucket", "vllm:kv", "up"}


def test_prometheus_files_are_host_files_in_the_manifest_and_valid_yaml():
    p = plan("gb200", m3_monitor=True)
    h, s = monitor.prometheus_service(p)
    files = {f.path: f for f in hostfiles.host_files(p, h)}
    conf = yaml.safe_load(files[monitor.PROMETHEUS_CONF].text)
    assert conf["global"]["external_labels"] == {"cluster": p.name}
    assert yaml.safe_load(files[monitor.PROMETHEUS_RULES].text)["groups"]
    assert files["/etc/systemd/system/prometheus.service"].link == "/dev/null"  # the package's unit, masked
    m = hostfiles.manifest(p, h)
    assert {monitor.PROMETHEUS_CONF, monitor.PROMETHEUS_RULES, "/etc/systemd/system/m3-prometheus.service"} <= set(m["files"])
    assert {"prometheus", "prometheus-node-exporter"} <= set(m["packages"])
    assert "m3-prometheus.service" in m["units"] and s.workdir in m["dirs"]
    assert not [e for k in hostfiles.MANIFEST_KEYS for e in m[k] if hostfiles.removal_problem(k, e)]


def test_alerts_cover_the_issues_list():
    p = plan("gb200", m3_monitor=True, m3_alert_ttft_p99_s=2.5)
    alerts = {r["alert"]: r for r in monitor.alert_rules(p)}
    assert {"M3NoRoutableWorker", "M3WorkerDown", "M3TimeToFirstTokenHigh", "M3KVCacheNearlyFull",
            "M3EtcdLeaderChanges", "M3NatsSlowConsumers", "M3HostDiskNearlyFull", "M3HostMemoryNearlyFull"} <= set(alerts)
    assert alerts["M3TimeToFirstTokenHigh"]["expr"].endswith("> 2.5")


def test_dashboards_per_cluster_list_its_workers_and_hosts():
    p = plan("gb200", m3_monitor=True)
    d = monitor.dashboards(p)
    assert set(d) == {f"m3-{p.name}-{x}.json" for x in ("overview", "workers", "hosts")}
    var = {v["name"]: v for v in d[f"m3-{p.name}-hosts.json"]["templating"]["list"]}
    assert var["host"]["query"].split(",") == [h.name for h in p.hosts]
    assert any("DCGM_FI_DEV_GPU_UTIL" in t["expr"] for pn in d[f"m3-{p.name}-hosts.json"]["panels"]
               for t in pn["targets"])


def test_quantile_from_cumulative_buckets_matches_prometheus_interpolation():
    assert quantile_from_buckets({0.1: 50, 0.2: 100, float("inf"): 100}, 0.5) == pytest.approx(0.1)
    assert quantile_from_buckets({0.1: 0, 0.2: 100, float("inf"): 100}, 0.5) == pytest.approx(0.15)
    assert quantile_from_buckets({float("inf"): 0}, 0.5) is None


def test_nats_exporter_publishes_varz_numbers_under_prometheus_nats_exporters_names():
    spec = importlib.util.spec_from_file_location("natsexp", REPO / "files" / "m3-nats-exporter.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = mod.render({"server_id": "N1", "slow_consumers": 2, "connections": 3, "jetstream": {}, "auth_required": True})
    assert 'gnatsd_varz_slow_consumers{server_id="N1"} 2' in lines
    assert "# TYPE gnatsd_varz_slow_consumers counter" in lines
    assert not [x for x in lines if "auth_required" in x or "jetstream" in x]


def test_the_bench_reports_server_view_summarizes_prometheus_ranges():
    from m3deploy.check.bench import serverview

    result = [{"metric": {"worker": "0"}, "values": [[10, "0.5"], [15, "NaN"], [20, "0.25"]]},
              {"metric": {"worker": "1"}, "values": [[10, "NaN"]]}]
    series, summary = serverview.summarize(result, "worker")
    assert series == {"0": [[10.0, 0.5], [20.0, 0.25]]}  # a series of NaN only is no series
    assert summary == {"0": {"max": 0.5, "mean": 0.375}}
    view = {"window": {"prometheus": "http://p", "step_s": 5}, "summary": {"worker KV cache usage": summary},
            "units": {"worker KV cache usage": "ratio"}}
    assert "| worker KV cache usage (ratio) | 0 | 0.5 | 0.375 |" in serverview.markdown(view)
    assert serverview.collect(plan(), 0, 10) == {}  # no Prometheus in the plan: nothing to add


def test_status_reads_a_161_mockers_own_metrics():
    """`m3deploy status --source direct` on the /metrics text a Dynamo 1.6.1 mocker served after 5 requests."""
    from m3deploy.check import status

    p = plan("gb200", m3_monitor=True, m3_engine="mocker", m3_platform="sim", m3_parallel="tp1", m3_variant="bf16",
             m3_features=[])  # gb200's eagle3-gqa and text-only are vLLM's: refused on the mocker
    h = p.host(p.workers[0].hosts[0])
    s = h.service(p.workers[0].services[0].split("/")[1])
    row = status._direct_worker(p, h, s, (FIX / "dynamo-1.6.1-mocker.metrics").read_text())
    assert row.up and row.inflight == 0 and row.rps == 5  # the generate counter (a rate once two reads exist)
    assert 0 < row.ttft_p50_s <= row.ttft_p99_s < 1
    assert row.kv_usage == 0 and row.uptime_s > 0
    assert row._ids == {"3f5d536a0e794728"}
    assert status._direct_worker(p, h, s, None).up is False


def test_a_standalone_engine_is_scraped_on_its_http_port():
    p = plan("h200", m3_monitor=True)
    engines = [t for t in monitor.targets(p) if t.job == "engine"]
    assert [(t.host, t.service) for t in engines] == [tuple(w.services[0].split("/")) for w in p.workers]
    for t in engines:
        s = p.host(t.host).service(t.service)
        assert t.address.endswith(f":{next(x.port for x in s.ports if x.name == 'http')}")
    assert all(r.get("expr", "").find('job="engine"') >= 0 for r in monitor.recording_rules(p) if r["record"] ==
               "m3:worker_kv_usage:ratio")
