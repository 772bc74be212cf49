"""Container runtime on hosts that run containers: Docker engine from the distribution's packages (GPU hosts: the
supported Ubuntu releases; the testbed's Debian hosts with m3_runtime=docker: Debian's docker.io), and on NVIDIA GPU
hosts the NVIDIA
Container Toolkit with docker's nvidia runtime (`nvidia-ctk runtime configure --runtime=docker`, only
when /etc/docker/daemon.json lacks it) and GPU persistence mode. Skips what is already right.

Reads host_plan(): services (any with an image), gpus, gpu_vendor. Data keys:
- m3_docker_packages (default ["docker.io"], Ubuntu's engine; e.g. ["docker-ce"] with Docker's repo)
- m3_nvidia_repo_url (see roles.drivers; the toolkit comes from the same NVIDIA repository)
"""
from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from m3deploy import facts
from roles import gpuhost, hostops


@deploy("Container runtime")
def deploy_runtime():
    from m3deploy.deploy import context

    hp = context.host_plan()
    if not (hp.gpus > 0 or any(s.image for s in hp.services)):
        return
    docker = host.get_fact(facts.DockerInfo)
    services = host.get_fact(facts.GpuServices)
    if not docker["present"]:
        if hp.gpus > 0:  # GPU hosts: the OSes the GPU roles support; else (the testbed) the distribution's docker.io
            gpuhost.require_ubuntu("install docker")
        # without Recommends, as etcd, NATS and rsync: docker.io's are git, needrestart (restarts services on
        # upgrades: unwanted on a serving host), apparmor, cgroupfs-mount, xz-utils, ca-certificates
        apt.packages(name="Install the Docker engine", packages=list(hp.images.docker_packages),
                     update=True, cache_time=3600, no_recommends=True, extra_install_args=gpuhost.APT_LOCK,
                     **hostops.APT_RETRIES)
    st = services.get("docker") or {}
    if not (st.get("active") == "active" and st.get("enabled") == "enabled"):
        systemd.service(name="Enable and start docker", service="docker", running=True, enabled=True)
    if hp.gpu_vendor != "nvidia" or hp.gpus <= 0:
        return
    if not docker["nvidia_ctk"]:
        os_ = gpuhost.require_ubuntu("install the NVIDIA Container Toolkit")
        update = gpuhost.ensure_cuda_repo(hp, os_)
        apt.packages(name="Install the NVIDIA Container Toolkit", packages=["nvidia-container-toolkit"],
                     update=update, extra_install_args=gpuhost.APT_LOCK, **hostops.APT_RETRIES)
    if not docker["nvidia_runtime"]:
        configure = server.shell(name="Add the nvidia runtime to /etc/docker/daemon.json",
                                 commands=["nvidia-ctk runtime configure --runtime=docker"])
        systemd.service(name="Restart docker to load the nvidia runtime", service="docker", restarted=True,
                        _if=configure.did_change)
    gpus = host.get_fact(facts.NvidiaSmi)["gpus"]
    if not gpus or any(g.get("persistence") != "Enabled" for g in gpus):
        server.shell(name="Enable GPU persistence mode", commands=["nvidia-smi -pm 1"])
