"""check_host / env_from_facts / the NCCL check's parsing, on fixture facts (no SSH)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from m3deploy import facts as host_facts
from m3deploy.check.preflight import (
    Check,
    check_host,
    env_from_facts,
    model_matches,
    nccl_command,
    parse_nccl_output,
    worker_image,
)
from m3deploy.core.build import driver_plan
from m3deploy.core.model import HostPlan, Service

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def device_facts(name="h200x2-device") -> dict:
    return json.loads((FIX / name / "facts.json").read_text())


def h200(**kw) -> HostPlan:
    base = dict(name="h200-01", address="10.0.0.1", groups=("workers",), platform="h200", gpu_vendor="nvidia",
                gpu_model="NVIDIA H200", gpus=2, gpu_memory_gb=141, weights_dir="/var/lib/m3/hf",
                weights_gb=100, shm_min_gb=16)
    base.update(kw)
    base.setdefault("driver", driver_plan({}, base["platform"], base["gpu_vendor"]))  # the plan's, from the catalog
    return HostPlan(**base)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_device_facts_pass_every_check():
    checks = by_name(check_host(h200(), device_facts()))
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert {"os", "gpu-vendor", "gpu-count", "gpu-model", "gpu-mixed", "gpu-memory", "driver", "mig", "reboot",
            "disk", "shm"} == set(checks)
    assert "580.159.04" in checks["driver"].detail and "open" in checks["driver"].detail


def test_too_few_gpus_wrong_model_and_old_driver():
    facts = device_facts("h200x1")
    facts["driver"]["version"] = "570.124.06"
    checks = by_name(check_host(h200(gpus=8, gpu_model="NVIDIA B200"), facts))
    assert not checks["gpu-count"].ok and "1 GPU found, plan needs 8" in checks["gpu-count"].detail
    assert not checks["gpu-model"].ok and checks["gpu-model"].fix
    assert not checks["driver"].ok and "580" in checks["driver"].fix


def test_mixed_models_mig_and_reboot():
    facts = device_facts()
    facts["gpus"][1] = {**facts["gpus"][1], "name": "NVIDIA H100 80GB HBM3", "mig": "Enabled"}
    facts["reboot"] = host_facts.parse_reboot("nvidia_loaded=570.1\nnvidia_installed=580.95.05\n")
    checks = by_name(check_host(h200(), facts))
    assert not checks["gpu-mixed"].ok and "H100" in checks["gpu-mixed"].detail
    assert not checks["mig"].ok and "1" in checks["mig"].detail
    assert not checks["reboot"].ok and "m3_allow_reboot" in checks["reboot"].fix


def test_nvml_mismatch_is_reported():
    facts = host_facts.assemble({"NvidiaSmi": {**host_facts.parse_nvidia_query(
        "Failed to initialize NVML: Driver/library version mismatch"), "present": True}})
    checks = by_name(check_host(h200(), facts))
    assert not checks["gpu-driver-loaded"].ok and "reboot" in checks["gpu-driver-loaded"].fix
    assert not checks["gpu-count"].ok


def test_disk_shm_and_rdma():
    facts = device_facts("h200x1")  # 69 GB free, 128 GiB shm, no RDMA
    checks = by_name(check_host(h200(gpus=1, weights_gb=444, shm_min_gb=200, needs_rdma=True), facts))
    assert not checks["disk"].ok and "444 GB" in checks["disk"].detail and "/var/lib" in checks["disk"].detail
    assert not checks["shm"].ok and "size=200G" in checks["shm"].fix
    assert not checks["rdma"].ok
    facts["rdma"] = host_facts.parse_rdma("dev=mlx5_0 port=1 state=1: DOWN phys=3: Disabled link_layer=InfiniBand netdev=ib0\n")
    assert not by_name(check_host(h200(gpus=1, needs_rdma=True), facts))["rdma"].ok
    facts["rdma"] = host_facts.parse_rdma("dev=mlx5_0 port=1 state=4: ACTIVE phys=5: LinkUp link_layer=InfiniBand netdev=ib0\n")
    assert by_name(check_host(h200(gpus=1, needs_rdma=True), facts))["rdma"].ok


def test_control_and_sim_hosts_skip_gpu_checks():
    facts = host_facts.assemble({"OsInfo": host_facts.parse_os_release("ID=debian\nVERSION_ID=12\n")},
                       host_facts.parse_df("checked=/\n100 50 /\n"))
    for hp in (HostPlan(name="ctl", address="10.0.0.2", groups=("control",)),
               HostPlan(name="sim-1", address="10.0.0.3", groups=("workers",), platform="sim")):
        checks = by_name(check_host(hp, facts))
        assert set(checks) == {"os", "disk", "shm"} and all(c.ok for c in checks.values())


def test_amd_checks_on_documented_mi300x_outputs():
    """MI300X facts built from tests/fixtures/mi300x, which are written from the AMD docs, not captured."""
    facts = host_facts.assemble({"AmdGpus": host_facts.parse_amd_smi_static((FIX / "mi300x" / "amd-smi-static.json").read_text()),
                        "RocmVersion": "7.2.0",
                        "AmdDevices": host_facts.parse_amd_devices("kfd=yes\ndri=card0 renderD128\ngroups=root video render\n")})
    hp = h200(platform="mi300x", gpu_vendor="amd", gpu_model="AMD Instinct MI300X", gpus=8, gpu_memory_gb=192,
              weights_gb=0, shm_min_gb=0)
    checks = by_name(check_host(hp, facts))
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    facts["driver"]["rocm_version"] = "6.4.1"
    facts["amd_devices"] = host_facts.parse_amd_devices("groups=root\n")
    checks = by_name(check_host(hp, facts))
    assert not checks["driver"].ok and "7.2" in checks["driver"].detail
    assert not checks["amd-devices"].ok


@pytest.mark.parametrize("expected,actual,ok", [
    ("NVIDIA H200", "NVIDIA H200", True), ("NVIDIA H200", "NVIDIA H200 NVL", True),
    ("NVIDIA H200", "NVIDIA H20", False), ("AMD Instinct MI300X", "Instinct MI300X", True),
    ("AMD Instinct MI355X", "AMD Instinct MI300X", False), ("NVIDIA B200", "NVIDIA B200", True),
])
def test_model_matches(expected, actual, ok):
    assert model_matches(expected, actual) is ok


def test_env_from_facts():
    facts = device_facts()
    assert env_from_facts(facts) == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    facts = copy.deepcopy(facts)
    facts["rdma"] = host_facts.parse_rdma(
        "dev=mlx5_0 port=1 state=4: ACTIVE phys=5: LinkUp link_layer=InfiniBand netdev=ib0\n"
        "dev=mlx5_1 port=1 state=1: DOWN phys=3: Disabled link_layer=InfiniBand netdev=ib1\n"
        "dev=mlx5_2 port=1 state=4: ACTIVE phys=5: LinkUp link_layer=Ethernet netdev=ens3\n")
    env = env_from_facts(facts)
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_2"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_2:1"
    assert env_from_facts(host_facts.assemble({})) == {}


@pytest.mark.parametrize("name,world", [("h200x1", 1), ("h200x2-device", 2)])
def test_nccl_output_captured_on_device(name, world):
    c = parse_nccl_output((FIX / name / "nccl-raw.txt").read_text())
    assert c.ok and f"{world} x NVIDIA H200 via host" in c.detail and "NCCL 2.28.9" in c.detail
    if world == 2:
        assert "bus bandwidth 327.06 GB/s" in c.detail
    assert not parse_nccl_output((FIX / name / "nccl-raw.txt").read_text(), min_busbw_gbps=1000).ok or world == 1


def test_nccl_failures():
    assert not parse_nccl_output("M3_NCCL_RUNNER none\n").ok
    c = parse_nccl_output("M3_NCCL_RUNNER host\nTraceback...\nRuntimeError: NCCL error\n")
    assert not c.ok and "NCCL error" in c.detail


def test_nccl_command_uses_host_torch_then_the_image():
    cmd = nccl_command(8, "vllm/vllm-openai@sha256:" + "a" * 64)
    assert "--nproc-per-node=8" in cmd and "base64 -d" in cmd and "trap" in cmd
    assert "docker run --rm --gpus all" in cmd and "-e NCCL_NVLS_ENABLE" in cmd
    assert "elif command -v docker" not in nccl_command(2)
    hp = h200(services=(Service(name="m3-worker@0", kind="worker", host="h200-01", argv=("vllm",), image="img:1"),))
    assert worker_image(hp) == "img:1" and worker_image(h200()) == ""


def test_preflight_checks_the_driver_the_plan_pins():
    """The drivers role and preflight read one section of the plan (HostPlan.driver): a pinned branch or ROCm is
    what preflight requires too, not the catalog's (issue 22)."""
    from m3deploy.core import build as planmod
    from m3deploy.core import inventory

    facts = device_facts()  # an H200 host with driver 580 loaded
    def host(**data):
        hosts = inventory.hosts_from_dict({"workers": [("h200-01", {"m3_address": "10.0.0.1"})]},
                                          all_data={"m3_platform": "h200", "m3_parallel": "tp8", **data})
        return planmod.build(hosts, name="t").hosts[0]

    assert host().driver.branch == 580 and by_name(check_host(host(), facts))["driver"].ok
    pinned = host(m3_nvidia_driver_branch=590)
    assert pinned.driver.branch == 590
    check = by_name(check_host(pinned, facts))["driver"]
    assert not check.ok and "need branch >= 590" in check.detail and "install driver branch 590+" in check.fix
    amd = host(m3_platform="mi300x", m3_rocm_version="7.3")
    facts = host_facts.assemble({"AmdGpus": host_facts.parse_amd_smi_static((FIX / "mi300x" / "amd-smi-static.json").read_text()),
                        "RocmVersion": "7.2.0",
                        "AmdDevices": host_facts.parse_amd_devices("kfd=yes\ndri=card0 renderD128\ngroups=root video render\n")})
    check = by_name(check_host(amd, facts))["driver"]
    assert amd.driver.rocm == "7.3" and not check.ok and "need ROCm >= 7.3" in check.detail


def test_one_version_parser():
    from m3deploy.core.catalog import version_tuple

    assert version_tuple("580.95.05") == (580, 95, 5)
    assert version_tuple("7.2.0-43") == (7, 2, 0)  # /opt/rocm/.info/version
    assert version_tuple("rocm-7.2") == (7, 2)
    assert version_tuple("") == version_tuple("n/a") == ()
