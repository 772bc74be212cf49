"""Networking env of multi-host workers comes from host facts where the recipe and the user did not set it,
and `m3deploy plan --explain` shows it (from the facts `m3deploy preflight` saved)."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from m3deploy.cli import main
from m3deploy.controller import factcache
from m3deploy.core import build as planmod
from m3deploy.core import inventory
from m3deploy.core.netenv import env_from_facts

ROOT = Path(__file__).resolve().parents[2]
RDMA = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "active": True},
        {"device": "mlx5_1", "port": 1, "state": "DOWN", "active": False},
        {"device": "mlx5_2", "port": 1, "state": "ACTIVE", "active": True}]


def two_trays(**host_data):
    groups = {"control": [("c", {"m3_address": "10.0.0.2"})],
              "workers": [("t1", {"m3_address": "10.0.0.11", **host_data}), ("t2", {"m3_address": "10.0.0.12"})]}
    data = {"m3_platform": "gb200", "m3_variant": "nvfp4", "m3_parallel": "tp8", "m3_serving": "dynamo"}
    return inventory.hosts_from_dict(groups, all_data=data)


def test_env_from_facts_uses_active_ports_only():
    env = env_from_facts({"default_interface": "enP5p9s0", "rdma": RDMA})
    assert env == {"NCCL_SOCKET_IFNAME": "enP5p9s0", "GLOO_SOCKET_IFNAME": "enP5p9s0",
                   "NCCL_IB_HCA": "mlx5_0,mlx5_2", "UCX_NET_DEVICES": "mlx5_0:1,mlx5_2:1"}


def test_h200_device_facts_have_no_rdma_env():
    import json
    facts = json.loads((ROOT / "tests/fixtures/h200x2-device/facts.json").read_text())
    facts = facts.get("facts", facts)
    env = env_from_facts(facts)
    assert env.get("NCCL_SOCKET_IFNAME") == "eth0" and "NCCL_IB_HCA" not in env


def test_facts_fill_what_nobody_set_with_provenance():
    facts = {"t1": {"env": env_from_facts({"default_interface": "eth9", "rdma": RDMA})}}
    p = planmod.build(two_trays(), facts=facts)
    svc = p.host("t1").services[0]
    env = dict(svc.env)
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_2" and env["NCCL_SOCKET_IFNAME"] == "eth9"
    prov = {x.key: x for x in svc.provenance}
    assert prov["env:NCCL_IB_HCA"].layer == "facts" and prov["env:NCCL_IB_HCA"].source == "facts of t1"
    assert "NCCL_IB_HCA" not in dict(p.host("t2").services[0].env)  # no facts for t2


def test_user_settings_win_over_facts():
    facts = {"t1": {"env": env_from_facts({"default_interface": "eth9", "rdma": RDMA})}}
    p = planmod.build(two_trays(m3_interface="enP5p9s0", m3_rdma_env={"NCCL_IB_HCA": "mlx5_4"}), facts=facts)
    env = dict(p.host("t1").services[0].env)
    assert env["NCCL_SOCKET_IFNAME"] == "enP5p9s0" and env["NCCL_IB_HCA"] == "mlx5_4"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_2:1"


def test_single_host_workers_get_no_facts_env():
    groups = {"workers": [("h", {"m3_address": "10.0.0.5"})]}
    p = planmod.build(inventory.hosts_from_dict(groups, all_data={"m3_platform": "h200"}),
                      facts={"h": {"env": {"NCCL_IB_HCA": "mlx5_0"}}})
    assert "NCCL_IB_HCA" not in dict(p.host("h").services[0].env)


def test_plan_explain_shows_cached_facts(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path))
    factcache.save("gb200", {"gb200-r01-t01": {"default_interface": "enP5p9s0", "rdma": RDMA}})
    r = CliRunner().invoke(main, ["plan", "inventories/gb200.py", "--host", "gb200-r01-t01", "--explain"])
    assert r.exit_code == 0, r.output
    assert "export NCCL_IB_HCA=mlx5_0,mlx5_2" in r.output
    assert "<- facts (facts of gb200-r01-t01)" in r.output
    r = CliRunner().invoke(main, ["plan", "inventories/gb200.py", "--host", "gb200-r01-t01", "--no-facts"])
    assert "NCCL_IB_HCA" not in r.output
