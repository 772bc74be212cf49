"""The KV fabric preflight of disaggregated serving (m3deploy/check/preflight/kvfabric.py; docs/DISAGG.md).

No RDMA fabric can run here: the preflight role runs under pyinfra's @fake connector on fact fixtures. The real
2x H200 capture (tests/fixtures/h200x2-device: no RDMA, no NIC in `nvidia-smi topo -m`) must fail both fabric
checks; the passing facts add to it what a host with a ConnectX port per GPU pair reports (constructed: RDMA port
states as /sys/class/infiniband gives them, NIC columns as `nvidia-smi topo -m` prints them). ucx_perftest's output
format: openucx/ucx issue 10649 (a `tag_bw` run over a 400 Gb/s port).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from test_gpu_roles import DEVICE, _device_fact_table, cplan, hplan

from m3deploy import facts
from m3deploy.check.preflight import check_host, kvfabric, run_kv_transfer_checks
from m3deploy.cli import load_plan
from m3deploy.core.model import Port, Service
from roles.preflight import PreflightFailed, preflight

# openucx/ucx issue 10649's tag_bw result: 46743.62 MiB/s overall = 49.0 GB/s (one 400 Gb/s port)
RDMA_RUN = ("[thread 0]               622      0.240  1668.561  1668.561    46821.78   46821.78         599         599\n"
            "Final:                  1000      0.240  1675.942  1671.351    46615.58   46743.62         597         598\n")
# the same table from a UCX that fell back to TCP (constructed: ~1.1 GB/s)
TCP_RUN = "Final:                    20   1000.000 60000.000 60000.000     1066.00     1066.00          17          17\n"
ACTIVE = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "netdev": "ib0",
           "active": True, "roce": False}]
NIC_TOPO = {"matrix": {"GPU0": {"GPU1": "NV18", "NIC0": "PIX"}, "GPU1": {"GPU0": "NV18", "NIC0": "PXB"},
                       "NIC0": {"GPU0": "PIX", "GPU1": "PXB"}}, "nvlink": DEVICE["topology"]["nvlink"]}


def disagg_host(name="h200-01", ucx_devices="mlx5_0:1", **kw):
    """A GPU host running a prefill worker (its NIXL side-channel port, the UCX env from its RDMA facts)."""
    svc = Service(name="m3-worker@0", kind="worker", host=name, argv=("python3", "-m", "dynamo.vllm",
                  "--disaggregation-mode", "prefill"), image="img@sha256:" + "ab" * 32,
                  env=(("UCX_TLS", "cuda_copy,cuda_ipc,rc"), ("UCX_NET_DEVICES", ucx_devices)),
                  ports=(Port("nixl", 5600, "10.0.0.11"),))
    return replace(hplan(name, **kw), services=(svc,))


def _facts(**over):
    return {**DEVICE, "rdma": ACTIVE, "topology": NIC_TOPO, **over}


def _check(checks, name):
    return next(c for c in checks if c.name == name)


def test_the_real_h200_capture_fails_both_fabric_checks():
    checks = check_host(disagg_host(), DEVICE)
    assert not _check(checks, "kv-rdma").ok and "TCP" in _check(checks, "kv-rdma").fix
    assert not _check(checks, "kv-gpu-nic").ok and "no NIC" in _check(checks, "kv-gpu-nic").detail


def test_aggregated_hosts_get_no_fabric_checks():
    assert not any(c.name.startswith("kv-") for c in check_host(hplan(), DEVICE))


def test_an_active_port_near_every_gpu_passes():
    checks = check_host(disagg_host(), _facts())
    assert _check(checks, "kv-rdma").ok and _check(checks, "kv-gpu-nic").ok, checks
    assert "GPU0: PIX, GPU1: PXB" in _check(checks, "kv-gpu-nic").detail


def test_ucx_net_devices_naming_a_down_port_fails():
    down = [{**ACTIVE[0], "device": "mlx5_1", "state": "DOWN", "active": False}]
    c = _check(check_host(disagg_host(ucx_devices="mlx5_1:1"), _facts(rdma=ACTIVE + down)), "kv-rdma")
    assert not c.ok and "mlx5_1, not an active port" in c.detail


def test_a_gpu_whose_nics_are_across_the_cpus_fails():
    far = {"matrix": {"GPU0": {"NIC0": "PIX"}, "GPU1": {"NIC0": "SYS"}}, "nvlink": {}}
    c = _check(check_host(disagg_host(), _facts(topology=far)), "kv-gpu-nic")
    assert not c.ok and "GPU1 reach every NIC only across the CPU interconnect (SYS)" in c.fix


def test_the_preflight_role_stops_a_deploy_on_a_host_without_rdma(fake):
    """roles/preflight.py under @fake: the device capture's facts (no RDMA) stop the deploy, naming the check."""
    with pytest.raises(PreflightFailed) as e:
        fake(preflight, facts=_device_fact_table(), host_plan=disagg_host(),
             cluster_plan=cplan(disagg_host()))
    assert "kv-rdma" in str(e.value) and "kv-gpu-nic" in str(e.value)


def test_the_preflight_role_passes_with_the_fabric(fake):
    t = {**_device_fact_table(), facts.RdmaDevices: ACTIVE, facts.NvidiaTopology: NIC_TOPO}
    assert fake(preflight, facts=t, host_plan=disagg_host(), cluster_plan=cplan(disagg_host())).ops == []


@pytest.mark.parametrize("text,ok,want", [
    (RDMA_RUN, True, "49.0 GB/s"), (TCP_RUN, False, "1.1 GB/s"), ("ucx_perftest: connection refused", False, "no "),
])
def test_perftest_against_the_floor(text, ok, want):
    c = kvfabric.parse_perftest(text, pair="a -> b")
    assert c.ok is ok and want in c.detail, c


def test_pairs_and_commands_of_the_gb200_plan():
    plan = load_plan("inventories/gb200_disagg.py", [], facts=False)
    assert kvfabric.transfer_pairs(plan) == [("gb200-r01-t01", "gb200-r01-t02")]
    srv, cli = kvfabric.perftest_commands(plan.host("gb200-r01-t02"), plan.host("gb200-r01-t01"), "img:1")
    assert "--entrypoint ucx_perftest" in srv and "-m cuda" in srv and "-e UCX_TLS=cuda_copy,cuda_ipc,rc" in srv
    assert " 10.20.1.12 " in cli and cli.endswith(f"-p {kvfabric.PERFTEST_PORT}")


class _Out:
    def __init__(self, text):
        self.output_lines = text.splitlines()


class _Host:
    """A connected host as run_kv_transfer_checks uses it (run_shell_command): its commands and a canned answer."""

    def __init__(self, answer: str):
        self.answer, self.ran = answer, []

    def run_shell_command(self, command, _timeout=None):
        self.ran.append(str(command))
        return True, _Out(self.answer)


def test_the_transfer_check_runs_server_on_decode_and_client_on_prefill():
    plan = load_plan("inventories/gb200_disagg.py", [], facts=False)
    pre, dec = _Host(TCP_RUN), _Host("")
    got = run_kv_transfer_checks({"gb200-r01-t01": pre, "gb200-r01-t02": dec}, plan)
    c = got["gb200-r01-t01->gb200-r01-t02"]
    assert not c.ok and "1.1 GB/s" in c.detail and "TCP fallback" in c.fix
    assert "10.20.1.12" in pre.ran[0] and "10.20.1.12" not in dec.ran[0]
