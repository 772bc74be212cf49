"""m3_disagg (m3deploy/core/disagg.py): prefill and decode pools, their hosts, flags and refusals.

Every flag and env name is read from the ai-dynamo 1.6.1 wheel: dynamo/vllm/backend_args.py and dynamo/vllm/args.py
(vLLM's --disaggregation-mode, the explicit NixlConnector --kv-transfer-config), dynamo/sglang/args.py +
dynamo/sglang/_disagg.py (SGLang's --disaggregation-*), dynamo/mocker/args.py (the mocker's --disaggregation-mode,
--bootstrap-ports, --kv-transfer-bandwidth, --kv-bytes-per-token) and dynamo/mocker/config.py (DYN_HTTP_RPC_HOST);
engine_contract.plan_problems checks each rendered command against the flag lists extracted from the wheels.
"""
from __future__ import annotations

import pytest
from engine_contract import plan_problems

from m3deploy.core import build, disagg, inventory
from m3deploy.core.errors import ValidationError

POOLS1 = {"prefill": {"workers": 1}, "decode": {"workers": 1}}
GPU = {"m3_platform": "h200", "m3_variant": "mxfp8", "m3_parallel": "tp8", "m3_engine": "vllm",
       "m3_serving": "dynamo"}
SIM = {"m3_platform": "sim", "m3_parallel": "tp1", "m3_engine": "mocker", "m3_serving": "dynamo"}


def _hosts(n: int, data: dict, per_host: dict | None = None):
    per_host = per_host or {}
    workers = [(f"w{i}", {"m3_address": f"10.0.0.{i}", **per_host.get(f"w{i}", {})}) for i in range(1, n + 1)]
    return inventory.hosts_from_dict({"control": [("c1", {"m3_address": "10.0.0.99"})], "workers": workers},
                                     all_data=data)


def _plan(n: int, data: dict, per_host: dict | None = None):
    return build.build(_hosts(n, data, per_host), name="t")


def _problems(n: int, data: dict, per_host: dict | None = None) -> list[str]:
    with pytest.raises(ValidationError) as e:
        _plan(n, data, per_host)
    return list(e.value.problems)


def _workers(plan):
    return [s for h in plan.hosts for s in h.services if s.kind == "worker"]


def _flag(svc, flag):
    return svc.argv[svc.argv.index(flag) + 1]


def test_absent_is_aggregated():
    plan = _plan(2, GPU)
    assert all(disagg.pool_of(s) == "" for s in _workers(plan))
    assert not any("--kv-transfer-config" in s.argv or s.port("nixl") for s in _workers(plan))
    empty = build.build(_hosts(2, {**GPU, "m3_disagg": {}}), name="t")  # {} is absent
    assert [h.services for h in empty.hosts] == [h.services for h in plan.hosts] and empty.workers == plan.workers


def test_hosts_join_in_rank_order_prefill_first():
    plan = _plan(3, {**GPU, "m3_disagg": {"prefill": {"workers": 1}, "decode": {"workers": 2}}})
    assert [(s.host, disagg.pool_of(s), s.worker) for s in _workers(plan)] == [
        ("w1", "prefill", 0), ("w2", "decode", 1), ("w3", "decode", 2)]
    assert [w.index for w in plan.workers] == [0, 1, 2]


def test_a_hosts_role_wins():
    plan = _plan(3, {**GPU, "m3_disagg": {"prefill": {"workers": 1}, "decode": {"workers": 2}}},
                 {"w3": {"m3_disagg_role": "prefill"}})
    assert {s.host: disagg.pool_of(s) for s in _workers(plan)} == {"w3": "prefill", "w1": "decode", "w2": "decode"}


def test_each_pool_has_its_own_parallel_flags_and_readiness():
    plan = _plan(2, {**GPU, "m3_disagg": {
        "prefill": {"workers": 2, "parallel": "tp4", "args": ["--max-num-batched-tokens", "32768"],
                    "env": {"VLLM_X": "1"}, "readiness_timeout_s": 99},
        "decode": {"workers": 1, "parallel": "tp8", "unset": ["--enable-prefix-caching"]}}})
    pre, dec = [s for s in _workers(plan) if disagg.pool_of(s) == "prefill"], [
        s for s in _workers(plan) if disagg.pool_of(s) == "decode"]
    assert [(s.host, s.name, s.devices) for s in pre] == [("w1", "m3-worker@0", (0, 1, 2, 3)),
                                                         ("w1", "m3-worker@1", (4, 5, 6, 7))]
    assert {_flag(s, "--tensor-parallel-size") for s in pre} == {"4"} and _flag(dec[0], "--tensor-parallel-size") == "8"
    assert all(_flag(s, "--max-num-batched-tokens") == "32768" and ("VLLM_X", "1") in s.env for s in pre)
    assert "--max-num-batched-tokens" not in dec[0].argv or _flag(dec[0], "--max-num-batched-tokens") != "32768"
    assert {s.readiness.timeout_s for s in pre} == {99} and dec[0].readiness.timeout_s != 99
    # one side-channel port per TP rank: the second worker on a host starts TP size further on
    assert [s.port("nixl").port for s in pre] == [5600, 5604]
    prov = {p.key: p.layer for p in pre[0].provenance}
    assert prov["--max-num-batched-tokens"] == "cluster:m3_disagg.prefill"
    assert [w.tensor_parallel for w in plan.workers] == [4, 4, 8]


def test_vllm_flags_env_and_contract():
    """dynamo/vllm/args.py: --connector is a hard error; prefill needs an explicit --kv-transfer-config."""
    plan = _plan(2, {**GPU, "m3_disagg": POOLS1})
    for s in _workers(plan):
        assert "--connector" not in s.argv
        assert _flag(s, "--kv-transfer-config") == '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
        env = dict(s.env)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == plan.host(s.host).address
        assert env["UCX_TLS"] == "cuda_copy,cuda_ipc,rc" and env["UCX_MEMTYPE_CACHE"] == "n"
    assert plan_problems(plan) == []


def test_sglang_flags_and_contract():
    plan = _plan(2, {**GPU, "m3_engine": "sglang", "m3_features": [], "m3_disagg": POOLS1})
    pre, dec = _workers(plan)
    for s in (pre, dec):
        assert _flag(s, "--disaggregation-transfer-backend") == "nixl"
    assert (_flag(pre, "--disaggregation-mode"), _flag(dec, "--disaggregation-mode")) == ("prefill", "decode")
    assert _flag(pre, "--disaggregation-bootstrap-port") == "8998" and pre.port("bootstrap").port == 8998
    assert "--disaggregation-bootstrap-port" not in dec.argv
    assert plan_problems(plan) == []


def test_mocker_flags_and_contract():
    """dynamo/mocker/args.py: one bootstrap port per worker, on prefill workers ("Prefill workers listen on these
    ports; decode workers connect to them"); dynamo/mocker/config.py: the bootstrap host is DYN_HTTP_RPC_HOST."""
    plan = _plan(2, {**SIM, "m3_disagg": {**POOLS1, "kv_transfer_bandwidth": 25}})
    pre, dec = _workers(plan)
    assert (_flag(pre, "--disaggregation-mode"), _flag(dec, "--disaggregation-mode")) == ("prefill", "decode")
    assert _flag(pre, "--bootstrap-ports") == "8998" and "--bootstrap-ports" not in dec.argv
    assert dict(pre.env)["DYN_HTTP_RPC_HOST"] == "10.0.0.1"
    for s in (pre, dec):
        assert _flag(s, "--kv-transfer-bandwidth") == "25" and _flag(s, "--kv-bytes-per-token") == "122880"
    assert plan_problems(plan) == []


def test_trtllm_is_refused_with_dynamos_reason():
    ps = _problems(2, {**GPU, "m3_variant": "bf16", "m3_engine": "trtllm", "m3_features": ["text-only"],
                       "m3_disagg": POOLS1})
    assert any("trtllm cannot serve MiniMax-M3 disaggregated" in p and "recipes/minimax-m3/README.md" in p
               for p in ps), ps


def test_encoder_disaggregation_is_refused():
    ps = _problems(2, {**GPU, "m3_disagg": {**POOLS1, "encode": {"workers": 1}}})
    assert any("m3_disagg" in p and "encoder disaggregation is not supported" in p for p in ps), ps


@pytest.mark.parametrize("pools,n,why", [
    ({"prefill": {"workers": 1}, "decode": {"workers": 2}}, 2, "the decode pool needs 2 hosts"),
    ({"prefill": {"workers": 1}, "decode": {"workers": 1}}, 3, "w3 are in no pool"),
    ({"prefill": {"workers": 1, "parallel": "tp3"}, "decode": {"workers": 1}}, 2, "does not lay out"),
    ({"prefill": {"workers": 1, "parallel": "tp4"}, "decode": {"workers": 1}}, 2, "do not fill whole hosts"),
    ({"prefill": {"workers": 4, "parallel": "tp2"}, "decode": {"workers": 1}}, 2, "below the mxfp8 weights' 513 GB"),
])
def test_pools_that_do_not_fit_are_refused(pools, n, why):
    ps = _problems(n, {**GPU, "m3_disagg": pools})
    assert any(why in p and "Fix:" in p for p in ps), ps


def test_a_role_beyond_the_pool_is_refused():
    ps = _problems(2, {**GPU, "m3_disagg": POOLS1}, {"w1": {"m3_disagg_role": "decode"},
                                                     "w2": {"m3_disagg_role": "decode"}})
    assert any("the decode pool needs 1 host" in p and "w1, w2 set m3_disagg_role = 'decode'" in p for p in ps), ps


@pytest.mark.parametrize("data,why", [
    ({"m3_serving": "standalone"}, "pools are Dynamo's"),
    ({"m3_features": ["kv-offload"], "m3_platform": "gb200", "m3_parallel": "tp4"}, "SimpleCPUOffloadConnector"),
    ({"m3_disagg": {"prefill": {"workers": 1}}}, "name both pools"),
    ({"m3_disagg": {**POOLS1, "prefill": {"wokers": 1}}}, "prefill.wokers: unknown key"),
    ({"m3_disagg": {**POOLS1, "decode": {"env": {"HF_TOKEN": "x"}}}}, "look(s) like a secret"),
])
def test_bad_settings_are_refused(data, why):
    ps = _problems(2, {**GPU, "m3_disagg": POOLS1, **data})
    assert any(why in p for p in ps), ps


def test_a_role_without_pools_is_refused():
    ps = _problems(2, GPU, {"w1": {"m3_disagg_role": "prefill"}})
    assert any("m3_disagg_role" in p and "m3_disagg is not set" in p for p in ps), ps


def test_rdma_facts_reach_disaggregated_workers():
    """core/netenv.py UCX_NET_DEVICES from the host's active RDMA ports, on every pool's worker (single-host ones
    too: NIXL moves the KV over them)."""
    plan = build.build(_hosts(2, {**GPU, "m3_disagg": POOLS1}), name="t",
                       facts={"w1": {"env": {"UCX_NET_DEVICES": "mlx5_0:1"}},
                              "w2": {"env": {"UCX_NET_DEVICES": "mlx5_1:1"}}})
    assert [dict(s.env)["UCX_NET_DEVICES"] for s in _workers(plan)] == ["mlx5_0:1", "mlx5_1:1"]
    agg = build.build(_hosts(2, GPU), name="t", facts={"w1": {"env": {"UCX_NET_DEVICES": "mlx5_0:1"}}})
    assert "UCX_NET_DEVICES" not in dict(_workers(agg)[0].env)  # aggregated single-host workers: unchanged


def test_verify_gains_the_disagg_checks_only_for_pools():
    from m3deploy.check.checks import worker_pools
    from m3deploy.check.verify.disagg import disagg_checks

    assert disagg_checks(_plan(2, SIM)) == [] and worker_pools(_plan(2, SIM)) == {}
    plan = _plan(2, {**SIM, "m3_disagg": POOLS1})
    assert [c.id for c in disagg_checks(plan)] == ["disagg/instances", "disagg/request", "disagg/stream",
                                                   "disagg/kv-router"]
    assert worker_pools(plan) == {"w1/m3-worker@0": "prefill", "w2/m3-worker@0": "decode"}


def test_pinned_requests_name_both_pools():
    """A pin in a disaggregated plan: prefill_worker_id + backend_instance_id (Dynamo 1.6.1 answers 400 to a
    backend_instance_id alone there: seen on the testbed)."""
    from m3deploy.check.readiness import _pin

    ids, pools = {"a": 1, "b": 2}, {"a": "prefill", "b": "decode"}
    assert _pin("a", 1, ids, pools) == {"instance_id": 2, "prefill_id": 1, "pool": "prefill"}
    assert _pin("b", 2, ids, pools) == {"instance_id": 2, "prefill_id": 1, "pool": "decode"}
    assert _pin("a", 1, ids, {}) == {"instance_id": 1}
