"""Private helpers of the GPU-host roles (drivers, runtime): apt options, the NVIDIA CUDA apt repository,
the supported-OS guard. No decisions about flags or env here."""
from __future__ import annotations

from pyinfra import host
from pyinfra.operations import apt

from m3deploy import facts
from m3deploy.core import catalog
from m3deploy.core.errors import M3Error

APT_LOCK = "-o DPkg::Lock::Timeout=900"  # fresh cloud hosts run unattended-upgrades at boot
CUDA_KEYRING = "cuda-keyring_1.1-1_all.deb"


def require_ubuntu(what: str) -> dict:
    os_ = host.get_fact(facts.OsInfo)
    supported = catalog.supported_os()
    if (os_["id"], os_["version_id"]) not in supported:
        raise M3Error(f"host {host.name}: cannot {what} on {os_['pretty'] or os_['id'] or 'this OS'}: the roles "
                      f"support {_os_list(supported)}. Fix: install it by hand (preflight accepts a working "
                      "driver as found) or use a supported OS")
    return os_


def _os_list(supported) -> str:
    """{("ubuntu", "22.04"), ("ubuntu", "24.04")} -> "Ubuntu 22.04 and 24.04"."""
    names = sorted({os_id for os_id, _ in supported})
    return "; ".join(f"{n.capitalize()} " + " and ".join(sorted(v for i, v in supported if i == n)) for n in names)


def cuda_repo_url(hp, os_: dict) -> str:
    """NVIDIA's CUDA apt repository for this host (the plan's driver.repo_url, m3_nvidia_repo_url: e.g. a local
    mirror, else NVIDIA's for the host's Ubuntu release and arch)."""
    url = hp.driver.repo_url
    if url:
        return url.rstrip("/") + "/"
    distro = "ubuntu" + os_["version_id"].replace(".", "")
    arch = "sbsa" if os_.get("arch") == "aarch64" else "x86_64"
    return f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}/"


def ensure_cuda_repo(hp, os_: dict) -> bool:
    """Add NVIDIA's apt repository (cuda-keyring) unless installed. True when apt needs an update."""
    if "cuda-keyring" in host.get_fact(facts.NvidiaPackages):
        return False
    apt.deb(name="Install NVIDIA's CUDA apt repository (cuda-keyring)", src=cuda_repo_url(hp, os_) + CUDA_KEYRING)
    return True
