"""Fact parsers on real captures (tests/fixtures/h200x2, h200x1, h200x2-device) and on AMD outputs.

The AMD fixtures (tests/fixtures/mi300x) are written from the AMD SMI / ROCm SMI documentation,
not captured on a host: see tests/fixtures/mi300x/README.md.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from m3deploy import facts as host_facts

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIX / "h200x2"
MI300X = FIX / "mi300x"


def read(d: Path, name: str) -> str:
    return (d / name).read_text()


# --- NVIDIA, captured on the 2x H200 host ---------------------------------------------------

def test_nvidia_query_h200x2():
    out = host_facts.parse_nvidia_query(read(H200, "query-gpu.csv"))
    assert out["error"] == ""
    assert [g["index"] for g in out["gpus"]] == [0, 1]
    g = out["gpus"][0]
    assert g["name"] == "NVIDIA H200"
    assert g["memory_mib"] == 143771
    assert g["compute_cap"] == "9.0"
    assert g["driver_version"] == "580.159.04"
    assert g["persistence"] == "Enabled" and g["mig"] == "Disabled"
    assert g["bus_id"] == "00000000:00:06.0"
    assert g["uuid"].startswith("GPU-1bcada45")


def test_nvidia_query_error_lines_are_kept():
    out = host_facts.parse_nvidia_query("##m3:nvidia-smi##\nFailed to initialize NVML: Driver/library version mismatch\n"
                               "NVML library version: 580.95\n")
    assert out["gpus"] == []
    assert "Driver/library version mismatch" in out["error"]


def test_proc_driver_version_h200x2():
    assert host_facts.parse_proc_driver_version(read(H200, "proc-driver-version.txt")) == {
        "version": "580.159.04", "flavor": "open"}
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"
    assert host_facts.parse_proc_driver_version(proprietary) == {"version": "550.127.05", "flavor": "proprietary"}
    assert host_facts.parse_proc_driver_version("") == {"version": "", "flavor": ""}


def test_cuda_version_h200x2():
    assert host_facts.parse_cuda_version(read(H200, "nvidia-smi.txt")) == "13.0"
    assert host_facts.parse_cuda_version(read(H200, "nvidia-smi-q.txt")) == "13.0"
    assert host_facts.parse_cuda_version("") == ""


def test_topology_h200x2():
    m = host_facts.parse_topo_matrix(read(H200, "topo.txt"))
    assert m == {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}


def test_topology_8gpu_with_nics():
    text = ("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV18\tPIX\t0-55\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tSYS\t0-55\t0\t\tN/A\n"
            "NIC0\tPIX\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n")
    m = host_facts.parse_topo_matrix(text)
    assert m["GPU0"] == {"GPU1": "NV18", "NIC0": "PIX"}
    assert m["NIC0"]["GPU1"] == "SYS"


def test_nvlink_h200x2():
    n = host_facts.parse_nvlink_status(read(H200, "nvlink.txt"))
    assert set(n) == {"0", "1"}
    assert n["0"]["links"] == 18 and n["0"]["active"] == 18
    assert n["0"]["gbps"] == pytest.approx(18 * 26.562)
    assert n["1"]["name"] == "NVIDIA H200"


def test_nvlink_inactive_links():
    n = host_facts.parse_nvlink_status("GPU 0: NVIDIA H100 (UUID: GPU-x)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n")
    assert n["0"] == {"name": "NVIDIA H100", "links": 2, "active": 1, "gbps": 26.562}


def test_os_release_h200x2():
    os_ = host_facts.parse_os_release(read(H200, "os-release.txt") + "KERNEL=6.18.44-fc-v657-gpu\nARCH=x86_64\n")
    assert os_["id"] == "ubuntu" and os_["version_id"] == "24.04" and os_["codename"] == "noble"
    assert os_["pretty"] == "Ubuntu 24.04.3 LTS"
    assert os_["kernel"] == "6.18.44-fc-v657-gpu"
    assert read(H200, "uname.txt").split()[2] == os_["kernel"]


def test_rdma_h200x2_is_empty():
    assert host_facts.parse_rdma(read(H200, "sys-ib.txt")) == []


def test_rdma_ib_and_roce():
    text = ("dev=mlx5_0 port=1 state=4: ACTIVE phys=5: LinkUp link_layer=InfiniBand netdev=ibp12s0\n"
            "dev=mlx5_1 port=1 state=1: DOWN phys=3: Disabled link_layer=Ethernet netdev=ens2f1np1\n"
            "dev=mlx5_2 port=1 state=4: ACTIVE phys=5: LinkUp link_layer=Ethernet netdev=\n")
    r = host_facts.parse_rdma(text)
    assert [d["device"] for d in r] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert r[0] == {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
                    "link_layer": "InfiniBand", "netdev": "ibp12s0", "active": True, "roce": False}
    assert not r[1]["active"] and r[1]["roce"]
    assert r[2]["active"] and r[2]["roce"] and r[2]["netdev"] == ""


def test_shm_and_df_h200x2():
    shm = host_facts.parse_df(read(H200, "shm.txt"), mount="/dev/shm")
    assert shm["size_bytes"] == 256 * 2**30 and shm["mount"] == "/dev/shm"
    root = host_facts.parse_df(read(H200, "df.txt"), mount="/")
    assert root["avail_bytes"] == 128 * 2**30 and root["size_bytes"] == 252 * 2**30
    raw = host_facts.parse_df("checked=/var/lib\n270553174016 84407308288 /\n")
    assert raw == {"checked": "/var/lib", "size_bytes": 270553174016, "avail_bytes": 84407308288, "mount": "/"}
    assert host_facts.parse_df("")["avail_bytes"] == 0


def test_proc_net_route():
    text = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
            "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
            "eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n"
            "eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
            "eth0\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n")
    assert host_facts.parse_proc_net_route(text) == "eth0"
    assert host_facts.parse_proc_net_route(text.splitlines()[0]) == ""
    assert host_facts.parse_proc_net_route("") == ""


def test_dpkg_and_upstream_versions():
    text = ("nvidia-driver-580-open=580.95.05-0ubuntu1=ii \n"
            "nvidia-fabricmanager-580=580.95.05-1=ii \n"
            "nvidia-driver-570=570.1-1=rc \n"
            "cuda-keyring==un \n")
    assert host_facts.parse_dpkg_versions(text) == {"nvidia-driver-580-open": "580.95.05-0ubuntu1",
                                           "nvidia-fabricmanager-580": "580.95.05-1"}
    assert host_facts.upstream_version("580.95.05-0ubuntu1") == "580.95.05"
    assert host_facts.upstream_version("1:7.2.0.70200-43~24.04") == "7.2.0.70200"
    assert host_facts.nvidia_driver_branch("580.159.04") == 580 and host_facts.nvidia_driver_branch("") == 0


def test_docker_fact():
    text = ("present=yes\nclient=Docker version 27.3.1, build ce12230\nserver=27.3.1\n"
            "ctk=NVIDIA Container Toolkit CLI version 1.17.4\n--- daemon.json\n"
            '{"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}\n')
    d = host_facts.parse_docker(text)
    assert d["present"] and d["server_running"] and d["version"] == "27.3.1"
    assert d["nvidia_ctk"] == "1.17.4" and d["nvidia_runtime"]
    assert host_facts.parse_docker("")["present"] is False
    assert host_facts.parse_docker("present=yes\nclient=Docker version 28.2.2, build x\nserver=\n")["version"] == "28.2.2"
    assert not host_facts.parse_docker("present=yes\n--- daemon.json\n{not json\n")["nvidia_runtime"]


def test_services_and_amd_devices():
    s = host_facts.parse_services("nvidia-fabricmanager enabled active\nnvidia-imex not-found unknown\n")
    assert s["nvidia-fabricmanager"] == {"enabled": "enabled", "active": "active", "present": True}
    assert s["nvidia-imex"]["present"] is False
    a = host_facts.parse_amd_devices("kfd=yes\ndri=by-path card0 card1 renderD128 renderD129 \ngroups=ubuntu video render\n")
    assert a["kfd"] and "renderD128" in a["dri"] and {"video", "render"} <= set(a["groups"])


def test_reboot_fact():
    assert host_facts.parse_reboot("nvidia_loaded=\nnvidia_installed=\n")["required"] is False
    r = host_facts.parse_reboot("nvidia_loaded=570.124.06\nnvidia_installed=580.95.05\n")
    assert r["required"] and "570.124.06" in r["reasons"][0] and "580.95.05" in r["reasons"][0]
    r = host_facts.parse_reboot("file=yes\npkg=linux-image-6.8.0-50-generic\n")
    assert r["required"] and "linux-image-6.8.0-50-generic" in r["reasons"][0]
    r = host_facts.parse_reboot("nvidia_loaded=580.159.04\nnvidia_installed=580.159.04\n")
    assert not r["required"]


def test_assemble_h200x2():
    values = {
        "NvidiaSmi": {**host_facts.parse_nvidia_query(read(H200, "query-gpu.csv")), "present": True},
        "NvidiaDriver": {**host_facts.parse_proc_driver_version(read(H200, "proc-driver-version.txt")),
                         "cuda_version": host_facts.parse_cuda_version(read(H200, "nvidia-smi.txt"))},
        "NvidiaTopology": {"matrix": host_facts.parse_topo_matrix(read(H200, "topo.txt")),
                           "nvlink": host_facts.parse_nvlink_status(read(H200, "nvlink.txt"))},
        "ShmSize": host_facts.parse_df(read(H200, "shm.txt"), mount="/dev/shm"),
        "OsInfo": host_facts.parse_os_release(read(H200, "os-release.txt")),
        "RdmaDevices": host_facts.parse_rdma(read(H200, "sys-ib.txt")),
    }
    facts = host_facts.assemble(values, host_facts.parse_df(read(H200, "df.txt"), mount="/"))
    assert facts["gpu_vendor"] == "nvidia" and len(facts["gpus"]) == 2
    assert facts["driver"] == {"version": "580.159.04", "flavor": "open", "cuda_version": "13.0",
                               "rocm_version": ""}
    assert facts["topology"]["matrix"]["GPU0"]["GPU1"] == "NV18"
    assert facts["rdma"] == [] and facts["default_interface"] == ""
    assert facts["reboot"]["required"] is False


def test_assemble_empty_host():
    facts = host_facts.assemble({})
    assert facts["gpu_vendor"] == "" and facts["gpus"] == [] and facts["driver"]["version"] == ""


# --- AMD, written from the documentation (see tests/fixtures/mi300x/README.md) ----------------

def test_amd_smi_static_mi300x():
    gpus = host_facts.parse_amd_smi_static(read(MI300X, "amd-smi-static.json"))
    assert len(gpus) == 8
    assert gpus[0] == {"index": 0, "name": "AMD Instinct MI300X", "gfx": "gfx942", "memory_mib": 196592,
                       "bus_id": "0000:05:00.0", "driver_version": "6.16.6"}


def test_amd_smi_static_older_list_form_and_string_sizes():
    text = ('[{"gpu": 0, "asic": {"market_name": "Instinct MI300X", "target_graphics_version": "gfx942"},'
            ' "vram": {"size": "196592 MB"}, "driver": {"name": "amdgpu", "version": "6.10.5"}}]')
    g = host_facts.parse_amd_smi_static(text)[0]
    assert g["memory_mib"] == 196592 and g["name"] == "Instinct MI300X" and g["driver_version"] == "6.10.5"
    assert host_facts.parse_amd_smi_static("") == [] and host_facts.parse_amd_smi_static("not json") == []


def test_rocm_smi_mi300x():
    gpus = host_facts.parse_rocm_smi_json(read(MI300X, "rocm-smi.json"))
    assert len(gpus) == 8
    assert gpus[7]["index"] == 7 and gpus[7]["gfx"] == "gfx942" and gpus[7]["memory_mib"] == 196592
    assert gpus[0]["driver_version"] == "6.16.6"


def test_rocm_topology_and_version_mi300x():
    t = host_facts.parse_rocm_topology(read(MI300X, "rocm-smi-showtopotype.json"))
    assert t["GPU0"]["GPU7"] == "XGMI" and t["GPU7"]["GPU0"] == "XGMI" and len(t) == 8
    assert host_facts.parse_rocm_version(read(MI300X, "rocm-version.txt")) == "7.2.0"
    assert host_facts.parse_rocm_version("") == ""


def test_assemble_mi300x():
    facts = host_facts.assemble({"AmdGpus": host_facts.parse_amd_smi_static(read(MI300X, "amd-smi-static.json")),
                        "RocmVersion": "7.2.0",
                        "AmdTopology": host_facts.parse_rocm_topology(read(MI300X, "rocm-smi-showtopotype.json"))})
    assert facts["gpu_vendor"] == "amd" and facts["driver"]["rocm_version"] == "7.2.0"
    assert facts["driver"]["version"] == "6.16.6"
    assert facts["topology"]["matrix"]["GPU1"]["GPU2"] == "XGMI"


# --- The fact classes themselves ----------------------------------------------------------

def test_fact_classes_process_their_command_output():
    smi = host_facts.NvidiaSmi().process(["##m3:nvidia-smi##"] + read(H200, "query-gpu.csv").splitlines())
    assert smi["present"] and len(smi["gpus"]) == 2
    topo = host_facts.NvidiaTopology().process(read(H200, "topo.txt").splitlines() + ["##m3:nvlink##"]
                                      + read(H200, "nvlink.txt").splitlines())
    assert topo["matrix"]["GPU1"]["GPU0"] == "NV18" and topo["nvlink"]["1"]["active"] == 18
    amd = host_facts.AmdGpus().process(["##m3:amd-smi##"] + read(MI300X, "amd-smi-static.json").splitlines())
    assert len(amd) == 8
    amd = host_facts.AmdGpus().process(["##m3:rocm-smi##"] + read(MI300X, "rocm-smi.json").splitlines())
    assert len(amd) == 8
    assert host_facts.FreeSpace().command("/var/lib/m3/hf").startswith("p=/var/lib/m3/hf;")
    assert "'/a b'" in host_facts.FreeSpace().command("/a b")


@pytest.mark.parametrize("cls", host_facts.ALL_FACTS + (host_facts.FreeSpace,))
def test_fact_commands_never_fail_on_a_gpu_free_host(cls, tmp_path):
    """Every command runs on this (GPU-free) machine, exits 0 and parses."""
    import subprocess

    cmd = cls().command("/nonexistent/m3/x") if cls is host_facts.FreeSpace else cls().command()
    p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (cmd, p.stderr)
    cls().process(p.stdout.splitlines())


# --- Captured on the lent H200 machines (tests/fixtures/h200x1, h200x2-device; see their README) --

DEVICE = [("h200x1", 1), ("h200x2-device", 2)]


def _facts_from_raw(d: Path) -> dict:
    """Rebuild gather_facts()' dict from each fact command's raw stdout, as pyinfra would."""
    values = {}
    for cls in host_facts.ALL_FACTS:
        text = read(d, f"fact-{cls.__name__}.txt")
        values[cls.__name__] = cls().process(text.splitlines()) if text.strip() else cls.default()
    disk = host_facts.FreeSpace().process(read(d, "fact-FreeSpace.txt").splitlines())
    return host_facts.assemble(values, disk)


@pytest.mark.parametrize("name,n", DEVICE)
def test_device_fact_outputs_rebuild_the_captured_facts(name, n):
    import json

    d = FIX / name
    facts = _facts_from_raw(d)
    captured = json.loads(read(d, "facts.json"))
    # free space moves between the two reads; everything else must be identical
    for f in (facts, captured):
        f["disk"].pop("avail_bytes")
    assert facts == captured
    assert facts["gpu_vendor"] == "nvidia" and len(facts["gpus"]) == n
    assert {g["name"] for g in facts["gpus"]} == {"NVIDIA H200"}
    assert facts["driver"] == {"version": "580.159.04", "flavor": "open", "cuda_version": "13.0", "rocm_version": ""}
    assert facts["default_interface"] == "eth0"
    assert facts["rdma"] == [] and facts["docker"]["present"] is False
    assert facts["reboot"]["required"] is False and facts["reboot"]["loaded"]["nvidia"] == "580.159.04"
    assert facts["os"]["version_id"] == "24.04"


@pytest.mark.parametrize("name,n", DEVICE)
def test_device_raw_tool_outputs(name, n):
    d = FIX / name
    q = host_facts.parse_nvidia_query(read(d, "query-gpu.csv"))
    assert len(q["gpus"]) == n and all(g["memory_mib"] == 143771 for g in q["gpus"])
    assert host_facts.parse_proc_driver_version(read(d, "proc-driver-version.txt"))["version"] == "580.159.04"
    assert host_facts.parse_cuda_version(read(d, "nvidia-smi.txt")) == "13.0"
    assert host_facts.parse_proc_net_route(read(d, "proc-net-route.txt")) == "eth0"
    shm = host_facts.parse_df(read(d, "df-B1.txt"), mount="/dev/shm")
    assert shm["size_bytes"] == n * 128 * 2**30
    topo = host_facts.parse_topo_matrix(read(d, "topo.txt"))
    nvl = host_facts.parse_nvlink_status(read(d, "nvlink.txt"))
    if n == 1:
        assert topo == {"GPU0": {}} and nvl == {}
    else:
        assert topo["GPU0"]["GPU1"] == "NV18" and nvl["1"]["active"] == 18
