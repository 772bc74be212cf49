"""Cluster-wide keys (settings.CLUSTER_KEYS) are one value for the whole cluster (issue 22; issue 28's first class):
set anywhere (a group_data file, a group, a host), it is every host's; hosts that set it differently, control
hosts included, are refused naming the key, the hosts and the fix."""
from __future__ import annotations

import pytest

from m3deploy.core import build as planmod
from m3deploy.core import inventory, settings
from m3deploy.core.errors import ValidationError

# two valid values of every cluster key: a new cluster key needs its pair here (test_every_cluster_key_has_a_case)
PAIRS = {
    "m3_variant": ("bf16", "mxfp8"), "m3_parallel": ("tp8", "tp8-ep"), "m3_engine": ("vllm", "sglang"),
    "m3_serving": ("standalone", "dynamo"), "m3_features": ([], ["text-only"]),
    "m3_max_model_len": (65536, 131072), "m3_extra_args": ([], ["--foo", "1"]), "m3_unset_args": ([], ["--x"]),
    "m3_extra_env": ({}, {"X_EXTRA": "1"}), "m3_image": ("vllm/vllm-openai:v1", "vllm/vllm-openai:v2"),
    "m3_model_id": ("MiniMaxAI/MiniMax-M3", "MiniMaxAI/Other"), "m3_served_model_name": ("a", "b"),
    "m3_state": ("present", "absent"), "m3_cluster": ("lab-a", "lab-b"),
    "m3_frontend_port": (8000, 8100), "m3_worker_port": (8000, 8100), "m3_system_port": (9090, 9190),
    "m3_kv_events_port": (5200, 5300), "m3_master_port": (29500, 29600), "m3_dynamo_version": ("1.6.1", "1.6.0"),
    "m3_venv_root": ("/opt/m3", "/opt/m3-b"), "m3_hf_cache": ("/var/lib/m3/hf", "/srv/m3/hf"),
    "m3_state_dir": ("/var/lib/m3", "/srv/m3"), "m3_max_num_seqs": (256, 128),
    "m3_cudagraph_capture_sizes": ([1, 2], [1, 4]), "m3_mocker_startup_time": (0, 5),
    "m3_mocker_speedup_ratio": (10, 20), "m3_readiness_timeout_s": (600, 900), "m3_auth": (True, False), "m3_etcd_lease_ttl": (120, 60),
    "m3_nats_max_payload": (33554432, 16777216), "m3_keep_caches": (False, True),
    "m3_rollout": ("rolling", "all-at-once"), "m3_rollout_max_unavailable": (1, 2),
    "m3_image_pull": ("missing", "always"), "m3_runtime": ("native", "docker"),
    "m3_api_key_file": ("/etc/m3-a/key", "/etc/m3-b/key"), "m3_weights_source": ("hub", "controller"),
    "m3_weights_fanout": (4, 2), "m3_weights_controller_cache": ("/srv/hf-a", "/srv/hf-b"),
    "m3_mock_repo_mb": (8, 16), "m3_mocker_engine_type": ("vllm", "sglang"),
    "m3_monitor": (False, True), "m3_prometheus_port": (9190, 9290), "m3_node_exporter_port": (9100, 9200),
    "m3_nats_exporter_port": (7777, 7778), "m3_monitor_scrape_interval_s": (15, 30),
    "m3_prometheus_retention_time": ("15d", "7d"), "m3_prometheus_retention_size": ("10GB", "5GB"),
    "m3_alert_ttft_p99_s": (10, 5), "m3_edge": (False, True), "m3_edge_port": (8443, 9443),
    "m3_edge_frontends": (2, 1), "m3_internal_tls": (False, True), "m3_tls_cert_file": ("/etc/m3-a/edge.pem", "/etc/m3-b/edge.pem"),
    "m3_tls_key_file": ("/etc/m3-a/edge.key", "/etc/m3-b/edge.key"),
    "m3_tls_ca_file": ("/etc/m3-a/ca.pem", "/etc/m3-b/ca.pem"),
    "m3_cert_renew_days": (30, 20), "m3_cert_validity_days": (730, 365), "m3_ca_validity_days": (3650, 1800),
    "m3_edge_timeout_server_s": (3600, 1800), "m3_edge_retry_body_kb": (64, 128),
    "m3_vip": ("10.0.0.200/24", "10.0.0.201/24"), "m3_vip_router_id": (7, 8),
    "m3_disagg": ({}, {"prefill": {"workers": 1}, "decode": {"workers": 1}}),
    "m3_planner": ({}, {"max": 3}),
}
BASE = {"m3_platform": "h200"}


def _problems(groups) -> list[str]:
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.hosts_from_dict(groups, all_data=BASE), name="t")
    return list(e.value.problems)


def test_every_cluster_key_has_a_case():
    assert set(PAIRS) == set(settings.CLUSTER_KEYS)


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_workers_that_differ_are_refused(key):
    a, b = PAIRS[key]
    problems = _problems({"workers": [("w1", {"m3_address": "10.0.0.1", key: a}),
                                      ("w2", {"m3_address": "10.0.0.2", key: b})]})
    assert any(p.startswith(f"key {key} differs between workers (") and "w1" in p and "w2" in p
               and "Fix: set it once" in p for p in problems), problems


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_a_control_host_that_differs_is_refused(key):
    a, b = PAIRS[key]
    problems = _problems({"control": [("c1", {"m3_address": "10.0.0.9", key: b})],
                          "workers": [("w1", {"m3_address": "10.0.0.1", key: a})]})
    assert any(p.startswith(f"key {key} differs between hosts (") and "c1" in p for p in problems), problems


def test_a_cluster_key_set_only_on_the_control_group_is_the_clusters():
    """Issue 28: `m3_frontend_port = 9000` in group_data/control.py rendered `--http-port 8000`."""
    hosts = inventory.hosts_from_dict(
        {"control": [("c1", {"m3_address": "10.0.0.9"})], "workers": [("w1", {"m3_address": "10.0.0.1"})]},
        all_data={**BASE, "m3_serving": "dynamo", "m3_parallel": "tp8"},
        group_data={"control": {"m3_frontend_port": 9000, "m3_system_port": 9300}})
    plan = planmod.build(hosts, name="t")
    fe = plan.host("c1").service("m3-frontend")
    assert fe.argv[fe.argv.index("--http-port") + 1] == "9000"
    assert [p.port for p in fe.ports] == [9000] and plan.endpoint == "http://10.0.0.9:9000/v1"
    worker = plan.host("w1").service("m3-worker@0")
    assert ("DYN_SYSTEM_PORT", "9300") in worker.env  # a worker key set on the control group reaches the workers
    assert dict(plan.settings)["m3_frontend_port"] == 9000


def test_rollout_and_nats_keys_become_the_plans_sections():
    """m3_rollout*, m3_nats_max_payload set on the control group only: the plan's typed sections hold them, and
    nats.conf (what roles/nats.py ships) is rendered from that section."""
    from m3deploy.deploy.hostfiles import nats_conf

    hosts = inventory.hosts_from_dict(
        {"control": [("c1", {"m3_address": "10.0.0.9"})], "workers": [("w1", {"m3_address": "10.0.0.1"})]},
        all_data={**BASE, "m3_serving": "dynamo", "m3_parallel": "tp8"},
        group_data={"control": {"m3_rollout": "all-at-once", "m3_rollout_max_unavailable": 3,
                                "m3_nats_max_payload": 16777216}})
    plan = planmod.build(hosts, name="lab")
    assert (plan.rollout.mode, plan.rollout.max_unavailable) == ("all-at-once", 3)
    assert (plan.nats.max_payload, plan.nats.cluster_name) == (16777216, "m3-lab")
    assert "max_payload: 16777216" in nats_conf(plan, plan.host("c1").service("nats")).text
    standalone = planmod.build(inventory.hosts_from_dict({"workers": [("w1", {"m3_address": "10.0.0.1"})]},
                                                         all_data=BASE), name="t")
    assert standalone.nats is None and standalone.rollout.mode == "rolling"  # no NATS; the default rollout


def test_the_refusal_names_the_files(tmp_path, monkeypatch):
    """A real inventory: the message names the group_data files that set the two values."""
    (tmp_path / "group_data").mkdir()
    (tmp_path / "inv.py").write_text('control = [("c1", {"m3_address": "10.0.0.9"})]\n'
                                     'workers = [("w1", {"m3_address": "10.0.0.1"})]\n')
    (tmp_path / "group_data" / "inv.py").write_text('m3_platform = "h200"\nm3_serving = "dynamo"\n')
    (tmp_path / "group_data" / "control.py").write_text('m3_engine = "sglang"\n')
    (tmp_path / "group_data" / "workers.py").write_text('m3_engine = "vllm"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.load_inventory(tmp_path / "inv.py"), name="inv")
    p = next(p for p in e.value.problems if p.startswith("key m3_engine differs"))
    assert "'sglang' on c1" in p and "control.py" in p and "'vllm' on w1" in p and "workers.py" in p
