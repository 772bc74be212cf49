"""The plan's typed sections, from the m3_* data and the catalog: a GPU host's driver (read by roles/drivers.py
and preflight), its images and its weights (roles/images.py, roles/weights.py); the cluster's rollout
(roles/rolling.py, roles/workers.py) and NATS (deploy/hostfiles.py's nats.conf)."""
from __future__ import annotations

from typing import Any, Mapping

from m3deploy.core import catalog, settings
from m3deploy.core.model import DriverPlan, ImagesPlan, NatsPlan, RolloutPlan, Service, WeightsPlan


def driver_plan(data: Mapping[str, Any], platform: str, vendor: str) -> DriverPlan:
    """A GPU host's driver: its m3_* data where set, else the catalog's vendor defaults and its platform's fabric."""
    def get(key):
        return settings.get(data, key)

    allow_reboot = bool(get("m3_allow_reboot"))
    if vendor == "amd":
        return DriverPlan(vendor="amd", rocm=str(get("m3_rocm_version") or catalog.vendor("amd")["rocm"]),
                          amdgpu_install_deb=str(get("m3_amdgpu_install_deb") or ""),
                          amdgpu_usecase=str(get("m3_amdgpu_usecase")), gpu_users=tuple(get("m3_gpu_users")),
                          allow_reboot=allow_reboot)
    nvidia, fabric = catalog.vendor("nvidia"), catalog.fabric_services(platform)
    fm, imex = get("m3_fabric_manager"), get("m3_imex")
    return DriverPlan(vendor="nvidia", branch=int(get("m3_nvidia_driver_branch") or nvidia["driver_branch"]),
                      flavor=str(get("m3_nvidia_driver_flavor") or nvidia["driver_flavor"]),
                      fabric_manager="nvidia-fabricmanager" in fabric if fm is None else bool(fm),
                      imex="nvidia-imex" in fabric if imex is None else bool(imex),
                      repo_url=str(get("m3_nvidia_repo_url") or ""), allow_reboot=allow_reboot)


def images_plan(data: Mapping[str, Any], pull: str) -> ImagesPlan:
    return ImagesPlan(pull=str(pull),
                      archive_dir=str(settings.get(data, "m3_image_archive_dir") or ""),
                      container_python=str(settings.get(data, "m3_container_python")),
                      sim_rootfs=str(settings.get(data, "m3_sim_image_rootfs") or ""),
                      docker_packages=tuple(str(p) for p in settings.get(data, "m3_docker_packages")))


def weights_plan(data: Mapping[str, Any], services: list[Service], venv: str) -> WeightsPlan:
    image = next((x.image for x in services if x.kind == "worker" and x.image), "")
    return WeightsPlan(download=str(settings.get(data, "m3_weights_download") or ("image" if image else "host")),
                       verify=bool(settings.get(data, "m3_weights_verify")),
                       hf_cli=str(settings.get(data, "m3_hf_cli") or (f"{venv}/bin/hf" if venv else "hf")),
                       token_file=str(settings.get(data, "m3_hf_token_file") or ""))


def rollout_plan(s: Mapping[str, Any]) -> RolloutPlan:
    """From the cluster's resolved settings (their defaults: core.settings)."""
    return RolloutPlan(mode=str(s["m3_rollout"]), max_unavailable=int(s["m3_rollout_max_unavailable"]))


def nats_plan(s: Mapping[str, Any], cluster: str) -> NatsPlan:
    return NatsPlan(max_payload=int(s["m3_nats_max_payload"]), cluster_name=f"m3-{cluster}")
