"""GPU drivers: NVIDIA (vendor CUDA apt repo, driver pinned to a branch, fabric manager on HGX, IMEX on
GB200: the platform's catalog `fabric:`) or AMD (amdgpu-install, the catalog's ROCm, render/video groups). Skips
whatever is already right and
reboots only when allowed; otherwise fails the host with a message naming it.

Reads host_plan(): gpu_vendor, gpus, platform and `driver` (core.model.DriverPlan: branch, flavor, fabric
manager, IMEX, CUDA repo, ROCm, amdgpu-install, GPU users, reboot; the plan derives it from the m3_nvidia_*,
m3_rocm_version, m3_amdgpu_*, m3_gpu_users and m3_allow_reboot keys, else catalog.yaml `vendors:` and the
platform's `fabric:`; preflight checks the same section); cluster_plan().hosts (IMEX peers).
"""
from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import apt, files, server, systemd

from m3deploy import facts
from m3deploy.core.catalog import version_tuple
from roles import gpuhost, hostops

IMEX_NODES = "/etc/nvidia-imex/nodes_config.cfg"


@deploy("GPU drivers")
def deploy_drivers():
    from m3deploy.deploy import context

    hp = context.host_plan()
    if hp.gpus <= 0 or hp.gpu_vendor not in ("nvidia", "amd"):
        return
    if hp.gpu_vendor == "nvidia":
        installing = _install_nvidia(hp)
        _reboot_if_needed(hp, installing, "nvidia-smi -L")
        _nvidia_services(hp, installing)
    else:
        installing = _install_rocm(hp)
        _reboot_if_needed(hp, installing, "amd-smi list || rocm-smi")


def _install_nvidia(hp) -> bool:
    """Install what is missing. True when the driver itself is (re)installed in this run."""
    if host.get_fact(File, path="/etc/dgx-release"):
        return False  # DGX OS manages its own driver stack
    d = hp.driver
    branch = d.branch
    driver_pkg = f"nvidia-driver-{branch}-open" if d.flavor == "open" else f"nvidia-driver-{branch}"
    want = [driver_pkg]
    if d.fabric_manager:
        want.append(f"nvidia-fabricmanager-{branch}")
    if d.imex:
        want.append(f"nvidia-imex-{branch}")
    pkgs = host.get_fact(facts.NvidiaPackages)
    loaded = host.get_fact(facts.NvidiaDriver)["version"]
    missing = [p for p in want if p not in pkgs]
    if driver_pkg in missing and facts.nvidia_driver_branch(loaded) == branch:
        missing.remove(driver_pkg)  # the right branch is loaded (runfile, image or DGX install): keep it
    if not missing:
        return False
    os_ = gpuhost.require_ubuntu(f"install {', '.join(missing)}")
    update = gpuhost.ensure_cuda_repo(hp, os_)
    apt.packages(name=f"Install {', '.join(missing)}", packages=missing, update=update,
                 extra_install_args=gpuhost.APT_LOCK, **hostops.APT_RETRIES)
    return driver_pkg in missing


def _nvidia_services(hp, installing: bool) -> None:
    services = host.get_fact(facts.GpuServices)
    if hp.driver.imex:
        from m3deploy.deploy import context

        peers = [h.address for h in context.cluster_plan().hosts if h.platform == hp.platform and h.gpus]
        files.put(name=f"Render {IMEX_NODES}", src=StringIO("\n".join(peers) + "\n"), dest=IMEX_NODES,
                  mode="644", create_remote_dir=True)
    for name, wanted in (("nvidia-fabricmanager", hp.driver.fabric_manager), ("nvidia-imex", hp.driver.imex)):
        st = services.get(name) or {}
        if not wanted or (st.get("active") == "active" and st.get("enabled") == "enabled"):
            continue
        systemd.service(name=f"Enable and start {name}", service=name, running=True, enabled=True,
                        daemon_reload=installing)


def _install_rocm(hp) -> bool:
    d = hp.driver
    want = d.rocm
    rocm = host.get_fact(facts.RocmVersion)
    devices = host.get_fact(facts.AmdDevices)
    installing = False
    if not (rocm and version_tuple(rocm)[:2] >= version_tuple(want)[:2] and devices["kfd"]):
        os_ = gpuhost.require_ubuntu(f"install ROCm {want}")
        kernel = os_["kernel"]
        apt.deb(name=f"Install amdgpu-install {want}",
                src=d.amdgpu_install_deb or amdgpu_install_url(want, os_["codename"]))
        apt.packages(name=f"Install kernel headers and extra modules for {kernel}",
                     packages=[f"linux-headers-{kernel}", f"linux-modules-extra-{kernel}"], update=True,
                     extra_install_args=gpuhost.APT_LOCK)
        usecase = d.amdgpu_usecase
        server.shell(name=f"Install ROCm {want} and the amdgpu driver ({usecase})",
                     commands=[f"DEBIAN_FRONTEND=noninteractive amdgpu-install -y --usecase={shlex.quote(usecase)}"])
        installing = True
    for user in d.gpu_users:
        groups = host.get_fact(facts.AmdDevices, user=user)["groups"]
        missing = [g for g in ("render", "video") if g not in groups]
        if missing:
            server.shell(name=f"Add {user} to the {' and '.join(missing)} group(s)",
                         commands=[f"usermod -aG {','.join(missing)} {shlex.quote(user)}"])
    return installing


def amdgpu_install_url(version: str, codename: str) -> str:
    """repo.radeon.com's amdgpu-install package: 7.2 -> .../7.2/ubuntu/noble/amdgpu-install_7.2.70200-1_all.deb."""
    major, minor, *rest = (list(version_tuple(version)) + [0, 0])[:3]
    patch = rest[0] if rest else 0
    short = f"{major}.{minor}" + (f".{patch}" if patch else "")
    return (f"https://repo.radeon.com/amdgpu-install/{short}/ubuntu/{codename}/"
            f"amdgpu-install_{short}.{major}{minor:02d}{patch:02d}-1_all.deb")


def _reboot_if_needed(hp, installing: bool, check_cmd: str) -> None:
    reasons = list(host.get_fact(facts.RebootRequired)["reasons"])
    if installing:
        reasons.append("the GPU driver is installed or changed in this run")
    if not reasons:
        return
    if hp.driver.allow_reboot:
        server.reboot(name="Reboot to load the GPU driver", delay=10, reboot_timeout=1200)
        server.shell(name="Check the GPU driver after the reboot", commands=[check_cmd])
        return
    msg = (f"host {host.name} needs a reboot ({'; '.join(reasons)}). Fix: reboot it and deploy again, "
           "or set m3_allow_reboot = True to let m3deploy reboot it")
    server.shell(name=f"Stop: {host.name} needs a reboot", commands=[f"echo {shlex.quote(msg)} >&2; exit 1"])
