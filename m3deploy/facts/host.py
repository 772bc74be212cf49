"""The pyinfra facts of a GPU host: each runs a command that is safe on any Linux host and hands its output to
a pure parser (m3deploy.facts.parse). `gather_facts(host, weights_dir)` collects them all into one JSON-able
dict; `assemble()` is its pure half, so tests and fixtures build the same dict from raw command outputs.
"""
from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase

from m3deploy.facts.parse import (
    NVIDIA_QUERY_FIELDS,
    NVIDIA_SMI_MARKER,
    parse_amd_devices,
    parse_amd_smi_static,
    parse_cuda_version,
    parse_df,
    parse_docker,
    parse_docker_image,
    parse_dpkg_versions,
    parse_ip_addr,
    parse_nvidia_query,
    parse_nvlink_status,
    parse_os_release,
    parse_proc_driver_version,
    parse_proc_net_route,
    parse_rdma,
    parse_reboot,
    parse_rocm_smi_json,
    parse_rocm_topology,
    parse_rocm_version,
    parse_services,
    parse_topo_matrix,
)

# --------------------------------------------------------------------------------------------
# The facts
# --------------------------------------------------------------------------------------------

class _M3Fact(FactBase):
    abstract = False
    parser: Any = None

    def process(self, output):
        return type(self).parser("\n".join(output))


class NvidiaSmi(_M3Fact):
    """GPUs as nvidia-smi sees them: {"present": bool, "gpus": [...], "error": str}."""

    def command(self):
        fields = ",".join(NVIDIA_QUERY_FIELDS)
        return ("if command -v nvidia-smi >/dev/null 2>&1; then "
                f"echo '{NVIDIA_SMI_MARKER}'; "
                f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits 2>&1 || true; fi")

    @staticmethod
    def default():
        return {"present": False, "gpus": [], "error": ""}

    def process(self, output):
        text = "\n".join(output)
        out = parse_nvidia_query(text)
        out["present"] = NVIDIA_SMI_MARKER in text
        return out


class NvidiaDriver(_M3Fact):
    """{"version", "flavor", "cuda_version"} of the loaded kernel module and nvidia-smi's header."""

    def command(self):
        return ("cat /proc/driver/nvidia/version 2>/dev/null; "
                "(nvidia-smi 2>/dev/null | grep -m1 'CUDA Version') || true")

    @staticmethod
    def default():
        return {"version": "", "flavor": "", "cuda_version": ""}

    def process(self, output):
        text = "\n".join(output)
        return {**parse_proc_driver_version(text), "cuda_version": parse_cuda_version(text)}


class NvidiaPackages(_M3Fact):
    """Installed NVIDIA driver / fabric manager / IMEX / toolkit packages: {pkg: version}."""

    command = staticmethod(lambda: (
        "dpkg-query -W -f='${Package}=${Version}=${db:Status-Abbrev}\\n' 'nvidia-driver-*' "
        "'nvidia-open*' 'cuda-drivers*' 'nvidia-fabricmanager*' 'nvidia-imex*' 'libnvidia-compute-*' "
        "'nvidia-container-toolkit' 'cuda-keyring' 2>/dev/null || true"))
    parser = staticmethod(parse_dpkg_versions)

    @staticmethod
    def default():
        return {}


class NvidiaTopology(_M3Fact):
    """{"matrix": parse_topo_matrix, "nvlink": parse_nvlink_status}."""

    def command(self):
        return ("if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi topo -m 2>/dev/null; "
                "echo '##m3:nvlink##'; nvidia-smi nvlink -s 2>/dev/null; fi; true")

    @staticmethod
    def default():
        return {"matrix": {}, "nvlink": {}}

    def process(self, output):
        topo, _, nvlink = "\n".join(output).partition("##m3:nvlink##")
        return {"matrix": parse_topo_matrix(topo), "nvlink": parse_nvlink_status(nvlink)}


class AmdGpus(_M3Fact):
    """AMD GPUs from amd-smi (preferred) or rocm-smi JSON: [{"index", "name", "gfx", "memory_mib", ...}]."""

    def command(self):
        return ("if command -v amd-smi >/dev/null 2>&1; then echo '##m3:amd-smi##'; "
                "amd-smi static --asic --vram --driver --bus --json 2>/dev/null; "
                "elif command -v rocm-smi >/dev/null 2>&1; then echo '##m3:rocm-smi##'; "
                "rocm-smi --showproductname --showmeminfo vram --showdriverversion --showbus --json "
                "2>/dev/null; fi; true")

    @staticmethod
    def default():
        return []

    def process(self, output):
        text = "\n".join(output)
        if "##m3:amd-smi##" in text:
            return parse_amd_smi_static(text.split("##m3:amd-smi##", 1)[1])
        if "##m3:rocm-smi##" in text:
            return parse_rocm_smi_json(text.split("##m3:rocm-smi##", 1)[1])
        return []


class AmdTopology(_M3Fact):
    """{"GPU0": {"GPU1": "XGMI"}} from rocm-smi --showtopotype --json."""

    command = staticmethod(lambda: "(rocm-smi --showtopotype --json 2>/dev/null) || true")
    parser = staticmethod(parse_rocm_topology)

    @staticmethod
    def default():
        return {}


class RocmVersion(_M3Fact):
    command = staticmethod(lambda: "cat /opt/rocm/.info/version 2>/dev/null || true")
    parser = staticmethod(parse_rocm_version)

    @staticmethod
    def default():
        return ""


RDMA_SCRIPT = r"""for d in /sys/class/infiniband/*; do [ -d "$d" ] || continue; dev=${d##*/};
for p in "$d"/ports/*; do [ -d "$p" ] || continue;
nd=$(ls "$d/device/net" 2>/dev/null | head -n1);
echo "dev=$dev port=${p##*/} state=$(cat "$p/state" 2>/dev/null) phys=$(cat "$p/phys_state" 2>/dev/null) link_layer=$(cat "$p/link_layer" 2>/dev/null) netdev=$nd";
done; done; true"""  # noqa: E501 (one echo line per port: the parser reads one record a line)


class RdmaDevices(_M3Fact):
    """[{"device", "port", "state", "link_layer", "netdev", "active", "roce"}] from /sys/class/infiniband."""

    command = staticmethod(lambda: RDMA_SCRIPT.replace("\n", " "))
    parser = staticmethod(parse_rdma)

    @staticmethod
    def default():
        return []


class DefaultRouteInterface(_M3Fact):
    """The default route's interface, read from /proc/net/route (works without `ip`)."""

    command = staticmethod(lambda: "cat /proc/net/route 2>/dev/null || true")
    parser = staticmethod(parse_proc_net_route)

    @staticmethod
    def default():
        return ""


class AddressInterfaces(_M3Fact):
    """{IPv4 address: (interface, prefix length)} of the host (`ip -o -4 addr show`): where the cluster address
    sits, the interface keepalived runs VRRP on (roles/vip.py)."""

    command = staticmethod(lambda: "ip -o -4 addr show 2>/dev/null || true")
    parser = staticmethod(parse_ip_addr)

    @staticmethod
    def default():
        return {}


class FreeSpace(_M3Fact):
    """Free bytes at PATH, or at its nearest existing parent: {"checked", "avail_bytes", "size_bytes", "mount"}."""

    def command(self, path):
        q = shlex.quote(path or "/")
        return (f"p={q}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
                "echo \"checked=$p\"; df -B1 --output=size,avail,target \"$p\" 2>/dev/null | tail -n +2; true")

    parser = staticmethod(parse_df)

    @staticmethod
    def default():
        return {"checked": "", "size_bytes": 0, "avail_bytes": 0, "mount": ""}


class ShmSize(FreeSpace):
    """/dev/shm's size and free bytes."""

    def command(self):
        return ("[ -d /dev/shm ] && df -B1 --output=size,avail,target /dev/shm 2>/dev/null "
                "| tail -n +2; true")


class OsInfo(_M3Fact):
    command = staticmethod(lambda: ("cat /etc/os-release 2>/dev/null; echo \"KERNEL=$(uname -r)\"; "
                                    "echo \"ARCH=$(uname -m)\""))
    parser = staticmethod(parse_os_release)

    @staticmethod
    def default():
        return parse_os_release("")


class DockerInfo(_M3Fact):
    """docker presence/version, nvidia-ctk, and whether /etc/docker/daemon.json has the nvidia runtime."""

    def command(self):
        return ("if command -v docker >/dev/null 2>&1; then echo present=yes; "
                "echo \"client=$(docker --version 2>/dev/null)\"; "
                "echo \"server=$(docker version --format '{{.Server.Version}}' 2>/dev/null)\"; fi; "
                "if command -v nvidia-ctk >/dev/null 2>&1; then "
                "echo \"ctk=$(nvidia-ctk --version 2>/dev/null | head -n1)\"; fi; "
                "if [ -f /etc/docker/daemon.json ]; then echo '--- daemon.json'; "
                "cat /etc/docker/daemon.json; fi; true")

    parser = staticmethod(parse_docker)

    @staticmethod
    def default():
        return parse_docker("")


GPU_SERVICES = ("nvidia-fabricmanager", "nvidia-imex", "nvidia-persistenced", "docker")


class GpuServices(_M3Fact):
    """systemd state of the fabric manager, IMEX, persistenced and docker: {name: {enabled, active, present}}."""

    def command(self):
        names = " ".join(GPU_SERVICES)
        return (f"command -v systemctl >/dev/null 2>&1 && for s in {names}; do "
                "e=$(systemctl is-enabled $s 2>/dev/null); a=$(systemctl is-active $s 2>/dev/null); "
                "echo \"$s ${e:-not-found} ${a:-unknown}\"; done; true")

    parser = staticmethod(parse_services)

    @staticmethod
    def default():
        return {}


class AmdDevices(_M3Fact):
    """/dev/kfd, /dev/dri/* and USER's groups (render, video)."""

    def command(self, user="root"):
        u = shlex.quote(user)
        return ("[ -e /dev/kfd ] && echo kfd=yes; [ -d /dev/dri ] && echo \"dri=$(ls /dev/dri | tr '\\n' ' ')\"; "
                f"echo \"groups=$(id -nG {u} 2>/dev/null)\"; true")

    parser = staticmethod(parse_amd_devices)

    @staticmethod
    def default():
        return parse_amd_devices("")


class RebootRequired(_M3Fact):
    """Reboot needed: /var/run/reboot-required, or the loaded nvidia/amdgpu module differs from the
    module installed for the running kernel (modinfo) or from the installed driver package."""

    def command(self):
        return ("[ -f /var/run/reboot-required ] && echo file=yes; "
                "sed 's/^/pkg=/' /var/run/reboot-required.pkgs 2>/dev/null; "
                "echo \"nvidia_loaded=$(cat /sys/module/nvidia/version 2>/dev/null || "
                "sed -n 's/^NVRM version:.*  \\([0-9][0-9.]*\\)  .*/\\1/p' /proc/driver/nvidia/version 2>/dev/null)\"; "
                "echo \"nvidia_installed=$(modinfo -F version nvidia 2>/dev/null)\"; "
                "echo \"amdgpu_loaded=$(cat /sys/module/amdgpu/version 2>/dev/null)\"; "
                "echo \"amdgpu_installed=$(modinfo -F version amdgpu 2>/dev/null)\"; true")

    parser = staticmethod(parse_reboot)

    @staticmethod
    def default():
        return parse_reboot("")


class DockerImage(_M3Fact):
    """Whether IMAGE (a tag or a digest reference) is in the host's docker image store."""

    def command(self, image):
        fmt = shlex.quote('{{.Id}} {{range .RepoDigests}}{{.}},{{end}}')
        return (f"(command -v docker >/dev/null 2>&1 && docker image inspect --format {fmt} "
                f"{shlex.quote(image)} 2>/dev/null) || true")

    parser = staticmethod(parse_docker_image)

    @staticmethod
    def default():
        return parse_docker_image("")


# --------------------------------------------------------------------------------------------
# All facts of a host, as one dict
# --------------------------------------------------------------------------------------------

ALL_FACTS = (NvidiaSmi, NvidiaDriver, NvidiaPackages, NvidiaTopology, AmdGpus, AmdTopology, RocmVersion,
             RdmaDevices, DefaultRouteInterface, ShmSize, OsInfo, DockerInfo, GpuServices, AmdDevices,
             RebootRequired)


def assemble(values: dict[str, Any], disk: dict[str, Any] | None = None) -> dict[str, Any]:
    """Combine processed fact values (keyed by fact class name) into the facts dict the checks read.

    Keys: gpu_vendor, gpus, gpu_error, driver{version, flavor, cuda_version, rocm_version},
    topology, rdma, default_interface, disk, shm, os, docker, services, amd_devices, reboot,
    packages. Missing values take the fact's default.
    """
    def get(cls):
        v = values.get(cls.__name__)
        return cls.default() if v is None else v

    smi, amd = get(NvidiaSmi), get(AmdGpus)
    nv_driver = get(NvidiaDriver)
    if smi["gpus"] or smi["present"]:
        vendor, gpus = "nvidia", smi["gpus"]
    elif amd:
        vendor, gpus = "amd", amd
    else:
        vendor, gpus = "", []
    driver = {"version": nv_driver["version"], "flavor": nv_driver["flavor"],
              "cuda_version": nv_driver["cuda_version"], "rocm_version": get(RocmVersion)}
    if vendor == "nvidia" and not driver["version"] and gpus:
        driver["version"] = gpus[0].get("driver_version", "")
    if vendor == "amd" and gpus:
        driver["version"] = gpus[0].get("driver_version", "")
    topo = get(NvidiaTopology) if vendor == "nvidia" else {"matrix": get(AmdTopology), "nvlink": {}}
    return {
        "gpu_vendor": vendor,
        "gpus": gpus,
        "gpu_error": smi.get("error", ""),
        "driver": driver,
        "topology": topo,
        "rdma": get(RdmaDevices),
        "default_interface": get(DefaultRouteInterface),
        "disk": disk or FreeSpace.default(),
        "shm": get(ShmSize),
        "os": get(OsInfo),
        "docker": get(DockerInfo),
        "services": get(GpuServices),
        "amd_devices": get(AmdDevices),
        "reboot": get(RebootRequired),
        "packages": get(NvidiaPackages),
    }


# What a host without GPUs (control hosts, the testbed's sim hosts) is checked on: OS, disk, shm, route.
BASE_FACTS = (OsInfo, ShmSize, DefaultRouteInterface)


def gather_facts(host, weights_dir: str = "/", gpu: bool = True) -> dict[str, Any]:
    """Run the facts on a connected pyinfra host (reads only) and assemble them: every fact for a GPU
    host, only BASE_FACTS otherwise (the others take their defaults)."""
    values = {cls.__name__: host.get_fact(cls) for cls in (ALL_FACTS if gpu else BASE_FACTS)}
    disk = host.get_fact(FreeSpace, path=weights_dir or "/")
    return assemble(values, disk)


