"""The GPU-host roles (drivers, runtime, images, weights, preflight) through pyinfra's @fake connector:
the exact commands pyinfra would run for a fresh host, an already-provisioned one (nothing to do),
a host needing a reboot, a wrong driver, missing GPUs, AMD, air-gapped images and the HF token.

Fact values come from the captured H200 fixtures (tests/fixtures/h200x2-device) where they exist.
"""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from m3deploy import facts as host_facts
from m3deploy.check import hfcache
from m3deploy.core import settings
from m3deploy.core.model import ClusterPlan, HostPlan, ModelRepo, Service
from m3deploy.core.sections import driver_plan, images_plan, weights_plan
from roles.drivers import amdgpu_install_url, deploy_drivers
from roles.images import deploy_images, image_archive_name
from roles.preflight import PreflightFailed, preflight
from roles.runtime import deploy_runtime
from roles.weights import deploy_weights, marker_path

FIX = Path(__file__).resolve().parents[1] / "fixtures"
DEVICE = json.loads((FIX / "h200x2-device" / "facts.json").read_text())
IMAGE = "vllm/vllm-openai@sha256:" + "ab" * 32
MODEL = "MiniMaxAI/MiniMax-M3"
DRAFT = "Inferact/MiniMax-M3-EAGLE3"
NOBLE = host_facts.parse_os_release((FIX / "h200x2-device" / "os-release.txt").read_text()
                           + "KERNEL=6.8.0-50-generic\nARCH=x86_64\n")


def worker(host="h200-01", image=IMAGE):
    return Service(name="m3-worker@0", kind="worker", host=host, argv=("vllm", "serve", MODEL), image=image)


def hplan(name="h200-01", platform="h200", vendor="nvidia", model="NVIDIA H200", gpus=2, image=IMAGE, data=None, **kw):
    """A GPU host's plan; its driver, images and weights sections are the plan's own (core.sections.driver_plan,
    images_plan, weights_plan) for the m3_* `data`."""
    data = data or {}
    services = (worker(name, image),) if gpus else ()
    base = dict(name=name, address="10.0.0.11", groups=("workers",), platform=platform, gpu_vendor=vendor,
                gpu_model=model, gpus=gpus, gpu_memory_gb=141, weights_dir="/var/lib/m3/hf", weights_gb=444,
                shm_min_gb=16, services=services, driver=driver_plan(data, platform, vendor) if gpus else None,
                images=images_plan(data, data.get("m3_image_pull", "missing")) if gpus else None,
                weights=weights_plan(data, list(services), ""))
    base.update(kw)
    return HostPlan(**base)


def cplan(*hosts, repos=(ModelRepo(MODEL, "target", "m3_model_id"),), **cluster_settings):
    """A plan of `hosts`; its cluster settings (what roles read for the whole cluster) are the defaults but
    `cluster_settings`."""
    recorded = {k: settings.KEYS[k].default for k in settings.CLUSTER_KEYS}
    assert set(cluster_settings) <= set(recorded), cluster_settings
    recorded.update(cluster_settings)
    return ClusterPlan(name="t", platform=hosts[0].platform, variant="mxfp8", parallel="tp2", engine="vllm",
                       serving="standalone", features=(), model_id=MODEL, served_model_name=MODEL,
                       max_model_len=None, state="present", hosts=tuple(hosts), workers=(), endpoint="",
                       model_repos=tuple(repos), settings=tuple(sorted(recorded.items())))


def provisioned_facts() -> dict:
    """An H200 host where everything is already right (driver from the device capture)."""
    return {
        host_facts.OsInfo: NOBLE,
        host_facts.NvidiaDriver: {k: DEVICE["driver"][k] for k in ("version", "flavor", "cuda_version")},
        host_facts.NvidiaPackages: {"cuda-keyring": "1.1-1", "nvidia-driver-580-open": "580.159.04-1ubuntu1",
                           "nvidia-fabricmanager-580": "580.159.04-1", "nvidia-container-toolkit": "1.17.4-1"},
        host_facts.NvidiaSmi: {"present": True, "gpus": DEVICE["gpus"], "error": ""},
        host_facts.RebootRequired: DEVICE["reboot"],
        host_facts.GpuServices: host_facts.parse_services("nvidia-fabricmanager enabled active\ndocker enabled active\n"),
        host_facts.DockerInfo: host_facts.parse_docker('present=yes\nclient=Docker version 27.5.1, build x\nserver=27.5.1\n'
                                     'ctk=NVIDIA Container Toolkit CLI version 1.17.4\n--- daemon.json\n'
                                     '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}'),
        host_facts.DockerImage: lambda image: {"present": True, "id": "sha256:1", "digests": [image]},
    }


def fresh_facts() -> dict:
    """A fresh Ubuntu 24.04 GPU host: no driver, no packages, no docker."""
    return {host_facts.OsInfo: NOBLE}


# --- drivers ---------------------------------------------------------------------------------

def test_fresh_nvidia_host_installs_the_pinned_branch_and_stops_for_the_reboot(fake):
    run = fake(deploy_drivers, facts=fresh_facts(), host_plan=hplan())
    assert [o.name.split(" | ")[1] for o in run.ops] == [
        "Install NVIDIA's CUDA apt repository (cuda-keyring)",
        "Install nvidia-driver-580-open, nvidia-fabricmanager-580",
        "Stop: @fake/h200-01 needs a reboot",
        "Enable and start nvidia-fabricmanager",
    ]
    keyring = run.op("GPU drivers | Install NVIDIA's CUDA").commands
    assert any("https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb"
               in c for c in keyring)
    assert run.op("GPU drivers | Install nvidia-driver").commands == [
        "apt-get update",
        'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" -o '
        'Dpkg::Options::="--force-confold" install -o DPkg::Lock::Timeout=900 nvidia-driver-580-open '
        "nvidia-fabricmanager-580",
    ]
    stop = run.op("GPU drivers | Stop").commands[0]
    assert "@fake/h200-01 needs a reboot" in stop and "m3_allow_reboot" in stop and stop.endswith("exit 1")
    assert run.op("GPU drivers | Enable and start nvidia-fabricmanager").commands == [
        "systemctl daemon-reload", "systemctl start nvidia-fabricmanager.service",
        "systemctl enable nvidia-fabricmanager.service"]


def test_fresh_host_with_reboot_allowed_reboots_and_rechecks(fake):
    run = fake(deploy_drivers, facts=fresh_facts(),
               host_plan=hplan(data={"m3_allow_reboot": True, "m3_nvidia_driver_branch": "590"}))
    names = [n.split(" | ")[1] for n in run.names]
    assert names[1] == "Install nvidia-driver-590-open, nvidia-fabricmanager-590"
    assert names[2:] == ["Reboot to load the GPU driver", "Check the GPU driver after the reboot",
                         "Enable and start nvidia-fabricmanager"]
    assert run.op("GPU drivers | Check the GPU driver").commands == ["nvidia-smi -L"]
    assert not any(n.split(" | ")[1].startswith("Stop:") for n in run.names)


def test_provisioned_host_has_nothing_to_do(fake):
    hp = hplan()
    for role in (deploy_drivers, deploy_runtime, deploy_images):
        assert fake(role, facts=provisioned_facts(), host_plan=hp, cluster_plan=cplan(hp)).ops == [], role
    facts = provisioned_facts()
    from pyinfra.facts.files import File
    facts[File] = lambda path: {"mode": 644} if path == marker_path(hp.weights_dir, MODEL) else None
    assert fake(deploy_weights, facts=facts, host_plan=hp, cluster_plan=cplan(hp)).ops == []


def test_right_branch_loaded_without_our_package_is_kept(fake):
    """The capture host's driver comes from a mounted driver dir (no dpkg package): not reinstalled."""
    facts = provisioned_facts()
    facts[host_facts.NvidiaPackages] = {"cuda-keyring": "1.1-1", "nvidia-fabricmanager-580": "580.159.04-1"}
    assert fake(deploy_drivers, facts=facts, host_plan=hplan()).ops == []


def test_host_needing_a_reboot_is_stopped_with_its_name(fake):
    facts = provisioned_facts()
    facts[host_facts.RebootRequired] = host_facts.parse_reboot("nvidia_loaded=570.124.06\nnvidia_installed=580.159.04\n")
    run = fake(deploy_drivers, facts=facts, host_plan=hplan())
    assert [n.split(" | ")[1] for n in run.names] == ["Stop: @fake/h200-01 needs a reboot"]
    assert "loaded nvidia kernel module 570.124.06 differs from the installed 580.159.04" in run.commands[0]
    run = fake(deploy_drivers, facts=facts, host_plan=hplan(data={"m3_allow_reboot": True}))
    assert [n.split(" | ")[1] for n in run.names] == ["Reboot to load the GPU driver",
                                                       "Check the GPU driver after the reboot"]


def test_wrong_driver_branch_is_replaced(fake):
    facts = provisioned_facts()
    facts[host_facts.NvidiaDriver] = {"version": "570.124.06", "flavor": "open", "cuda_version": "12.8"}
    facts[host_facts.NvidiaPackages] = {"cuda-keyring": "1.1-1", "nvidia-driver-570-open": "570.124.06-1",
                               "nvidia-fabricmanager-570": "570.124.06-1"}
    run = fake(deploy_drivers, facts=facts, host_plan=hplan())
    assert [n.split(" | ")[1] for n in run.names] == [
        "Install nvidia-driver-580-open, nvidia-fabricmanager-580", "Stop: @fake/h200-01 needs a reboot"]
    assert run.commands[0] == "DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::=\"--force-confdef\" " \
        "-o Dpkg::Options::=\"--force-confold\" install -o DPkg::Lock::Timeout=900 nvidia-driver-580-open " \
        "nvidia-fabricmanager-580"  # keyring present: no apt-get update, no keyring op


def test_gb200_gets_imex_not_fabric_manager(fake):
    a = hplan("gb200-01", platform="gb200", model="NVIDIA GB200", gpus=4, address="10.1.0.1",
              data={"m3_allow_reboot": True})
    b = hplan("gb200-02", platform="gb200", model="NVIDIA GB200", gpus=4, address="10.1.0.2")
    run = fake(deploy_drivers, facts=fresh_facts(), host_plan=a, cluster_plan=cplan(a, b))
    names = [n.split(" | ")[1] for n in run.names]
    assert "Install nvidia-driver-580-open, nvidia-imex-580" in names
    assert "Render /etc/nvidia-imex/nodes_config.cfg" in names and "Enable and start nvidia-imex" in names
    assert not any("fabricmanager" in n for n in names)
    assert "UPLOAD /etc/nvidia-imex/nodes_config.cfg" in run.commands


def test_control_and_sim_hosts_are_left_alone(fake):
    ctl = HostPlan(name="ctl-01", address="10.0.0.2", groups=("control",))
    sim = HostPlan(name="sim-01", address="10.0.0.3", groups=("workers",), platform="sim", gpus=0,
                   services=(Service(name="m3-worker@0", kind="worker", host="sim-01", argv=("python3",)),))
    for hp in (ctl, sim):
        for role in (deploy_drivers, deploy_runtime, deploy_images, deploy_weights):
            assert fake(role, facts=fresh_facts(), host_plan=hp, cluster_plan=cplan(hp)).ops == [], (hp.name, role)


def test_non_ubuntu_fresh_host_gets_a_clear_error(fake):
    from m3deploy.core.errors import M3Error

    with pytest.raises(M3Error, match="Ubuntu 22.04 and 24.04"):
        fake(deploy_drivers, facts={host_facts.OsInfo: host_facts.parse_os_release("ID=rocky\nVERSION_ID=9.4\n")}, host_plan=hplan())


# --- AMD ------------------------------------------------------------------------------------

def test_fresh_amd_host_installs_rocm_and_groups(fake):
    hp = hplan("mi300x-01", platform="mi300x", vendor="amd", model="AMD Instinct MI300X", gpus=8,
               data={"m3_gpu_users": ["ubuntu"]})
    run = fake(deploy_drivers, facts=fresh_facts(), host_plan=hp)
    names = [n.split(" | ")[1] for n in run.names]
    assert names == ["Install amdgpu-install 7.2", "Install kernel headers and extra modules for 6.8.0-50-generic",
                     "Install ROCm 7.2 and the amdgpu driver (dkms,rocm)", "Add ubuntu to the render and video group(s)",
                     "Stop: @fake/mi300x-01 needs a reboot"]
    assert any("https://repo.radeon.com/amdgpu-install/7.2/ubuntu/noble/amdgpu-install_7.2.70200-1_all.deb" in c
               for c in run.op("GPU drivers | Install amdgpu-install").commands)
    assert run.op("GPU drivers | Install kernel headers").commands[-1].endswith(
        "install -o DPkg::Lock::Timeout=900 linux-headers-6.8.0-50-generic linux-modules-extra-6.8.0-50-generic")
    assert run.op("GPU drivers | Install ROCm").commands == [
        "DEBIAN_FRONTEND=noninteractive amdgpu-install -y --usecase=dkms,rocm"]
    assert run.op("GPU drivers | Add ubuntu").commands == ["usermod -aG render,video ubuntu"]


def test_provisioned_amd_host_has_nothing_to_do(fake):
    hp = hplan("mi300x-01", platform="mi300x", vendor="amd", model="AMD Instinct MI300X", gpus=8,
               data={"m3_gpu_users": ["ubuntu"]})
    facts = {host_facts.OsInfo: NOBLE, host_facts.RocmVersion: "7.2.0",
             host_facts.AmdDevices: lambda user="root": host_facts.parse_amd_devices(f"kfd=yes\ndri=card0 renderD128\ngroups={user} video render\n"),
             host_facts.RebootRequired: host_facts.parse_reboot("")}
    assert fake(deploy_drivers, facts=facts, host_plan=hp).ops == []


def test_amdgpu_install_url():
    assert amdgpu_install_url("7.2.1", "jammy") == \
        "https://repo.radeon.com/amdgpu-install/7.2.1/ubuntu/jammy/amdgpu-install_7.2.1.70201-1_all.deb"


# --- runtime ----------------------------------------------------------------------------------

def test_fresh_runtime(fake):
    run = fake(deploy_runtime, facts=fresh_facts(), host_plan=hplan())
    names = [n.split(" | ")[1] for n in run.names]
    assert names == ["Install the Docker engine", "Enable and start docker",
                     "Install NVIDIA's CUDA apt repository (cuda-keyring)", "Install the NVIDIA Container Toolkit",
                     "Add the nvidia runtime to /etc/docker/daemon.json", "Restart docker to load the nvidia runtime",
                     "Enable GPU persistence mode"]
    assert run.op("Container runtime | Add the nvidia runtime").commands == [
        "nvidia-ctk runtime configure --runtime=docker"]
    restart = run.op("Container runtime | Restart docker")
    # pyinfra's systemd.service starts (not restarts) a unit its facts say is stopped; under @fake
    # every unit reads as stopped. The op only runs if nvidia-ctk changed daemon.json (_if).
    assert restart.conditional and restart.commands == ["systemctl start docker.service"]
    assert run.op("Container runtime | Enable GPU persistence").commands == ["nvidia-smi -pm 1"]


def test_runtime_configures_only_what_daemon_json_lacks(fake):
    facts = provisioned_facts()
    facts[host_facts.DockerInfo] = host_facts.parse_docker("present=yes\nserver=27.5.1\nctk=NVIDIA Container Toolkit CLI version 1.17.4\n"
                                         '--- daemon.json\n{"log-driver": "json-file"}')
    gpus = copy.deepcopy(DEVICE["gpus"])
    gpus[1]["persistence"] = "Disabled"
    facts[host_facts.NvidiaSmi] = {"present": True, "gpus": gpus, "error": ""}
    run = fake(deploy_runtime, facts=facts, host_plan=hplan())
    assert [n.split(" | ")[1] for n in run.names] == [
        "Add the nvidia runtime to /etc/docker/daemon.json", "Restart docker to load the nvidia runtime",
        "Enable GPU persistence mode"]


# --- images -----------------------------------------------------------------------------------

def test_images_pull_by_digest_and_skip_present(fake):
    facts = {host_facts.DockerImage: lambda image: host_facts.parse_docker_image("")}
    hp = hplan()
    run = fake(deploy_images, facts=facts, host_plan=hp, cluster_plan=cplan(hp))
    assert run.commands == [f"docker pull {IMAGE}"]
    assert fake(deploy_images, facts=provisioned_facts(), host_plan=hp, cluster_plan=cplan(hp)).ops == []


def test_image_pull_always_repulls_tags_never_digests(fake):
    """m3_image_pull=always: a tag present on the host (an old :nightly) is pulled again; a digest is immutable."""
    tag = "rocm/vllm-dev:nightly"
    hp = hplan(services=(worker("h200-01", tag), replace(worker("h200-01", IMAGE), name="m3-worker@1")))
    always = replace(hp, images=images_plan({}, "always"))
    run = fake(deploy_images, facts=provisioned_facts(), host_plan=always, cluster_plan=cplan(always))
    assert run.commands == [f"docker pull {tag}"]
    assert fake(deploy_images, facts=provisioned_facts(), host_plan=hp, cluster_plan=cplan(hp)).ops == []  # missing


def test_images_air_gapped_upload_and_load(fake, tmp_path):
    (tmp_path / image_archive_name(IMAGE)).write_bytes(b"tar")
    facts = {host_facts.DockerImage: lambda image: host_facts.parse_docker_image("")}
    hp = hplan(data={"m3_image_archive_dir": str(tmp_path)})
    run = fake(deploy_images, facts=facts, host_plan=hp, cluster_plan=cplan(hp))
    remote = f"/var/lib/m3/images/{image_archive_name(IMAGE)}"
    assert f"UPLOAD {remote}" in run.commands
    assert run.op("Container images | Load").commands == [f"docker load -i {remote}", f"rm -f {remote}"]
    assert not any(c.startswith("docker pull") for c in run.commands)


def test_images_air_gapped_missing_archive_names_the_fix(fake, tmp_path):
    from m3deploy.core.errors import M3Error

    with pytest.raises(M3Error, match="m3deploy save-images INVENTORY"):
        hp = hplan(data={"m3_image_archive_dir": str(tmp_path)})
        fake(deploy_images, facts={host_facts.DockerImage: lambda image: host_facts.parse_docker_image("")}, host_plan=hp,
             cluster_plan=cplan(hp))


# --- weights ----------------------------------------------------------------------------------

def test_weights_download_in_the_image_with_the_token_in_a_0600_file(fake, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETsecretSECRET")
    hp = hplan()
    run = fake(deploy_weights, facts={}, host_plan=hp, cluster_plan=cplan(hp))
    names = [n.split(" | ")[1] for n in run.names]
    assert names == ["Create /var/lib/m3/hf", "Create /etc/m3", "Upload the Hugging Face token to /etc/m3/hf_token (0600)",
                     f"Download {MODEL} (target) into /var/lib/m3/hf (resumable, verified)", "Remove /etc/m3/hf_token"]
    assert not any("hf_SECRET" in c or "hf_SECRET" in n for c in run.commands for n in run.names)
    upload = run.op("Model weights | Upload the Hugging Face token")
    assert "UPLOAD /etc/m3/hf_token" in upload.commands and any("chmod 600 /etc/m3/hf_token" in c for c in upload.commands)
    hf = (f"docker run --rm --network=host -v /var/lib/m3/hf:/root/.cache/huggingface -v /etc/m3/hf_token:"
          f"/run/secrets/hf_token:ro -e HF_TOKEN_PATH=/run/secrets/hf_token --entrypoint hf {IMAGE}")
    assert run.op("Model weights | Download").commands == [
        f"{hf} download {MODEL}", f"{hf} cache verify {MODEL} --fail-on-missing-files",
        hfcache.remote_command("/var/lib/m3/hf/hub", [f"{MODEL}@main:target"]),
        f"touch {marker_path('/var/lib/m3/hf', MODEL)}"]


def test_weights_stage_every_repo_the_workers_load(fake, monkeypatch):
    """The EAGLE3 draft head is staged next to the target, each checked complete before its marker; a repo
    already complete (its marker present) is left alone."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hp = hplan()
    repos = (ModelRepo(MODEL, "target", "m3_model_id"), ModelRepo(DRAFT, "draft", "--speculative-config"))
    run = fake(deploy_weights, facts={}, host_plan=hp, cluster_plan=cplan(hp, repos=repos))
    downloads = [o for o in run.ops if "| Download" in o.name]
    assert [o.name.split(" | ")[1] for o in downloads] == [
        f"Download {MODEL} (target) into /var/lib/m3/hf (resumable, verified)",
        f"Download {DRAFT} (draft) into /var/lib/m3/hf (resumable, verified)"]
    assert any(c.endswith(f"download {DRAFT}") for c in downloads[1].commands)
    assert downloads[1].commands[-2] == hfcache.remote_command("/var/lib/m3/hf/hub", [f"{DRAFT}@main:draft"])
    from pyinfra.facts.files import File

    run = fake(deploy_weights, host_plan=hp, cluster_plan=cplan(hp, repos=repos), facts={
        File: lambda path: {"mode": 644} if path == marker_path("/var/lib/m3/hf", MODEL) else None})
    assert [o.name.split(" | ")[1] for o in run.ops if "| Download" in o.name] == [
        f"Download {DRAFT} (draft) into /var/lib/m3/hf (resumable, verified)"]


def test_weights_on_the_host_from_a_token_file(fake, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    tok = tmp_path / "token"
    tok.write_text("hf_filetoken\n")
    tok.chmod(0o600)
    hp = hplan(image=None, data={"m3_hf_token_file": str(tok), "m3_hf_cli": "/opt/m3/bin/hf",
                                 "m3_weights_verify": False})
    run = fake(deploy_weights, facts={}, host_plan=hp, cluster_plan=cplan(hp))
    assert run.op("Model weights | Download").commands[0] == \
        f"HF_HOME=/var/lib/m3/hf HF_TOKEN_PATH=/etc/m3/hf_token /opt/m3/bin/hf download {MODEL}"
    assert not any("hf_filetoken" in c for c in run.commands)
    tok.chmod(0o644)
    from m3deploy.core.errors import M3Error
    with pytest.raises(M3Error, match="chmod 600"):
        fake(deploy_weights, facts={}, host_plan=hp, cluster_plan=cplan(hp))


def test_weights_shared_cache_downloads_once(fake, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    a, b = hplan("h200-01"), hplan("h200-02", address="10.0.0.12")
    run = fake(deploy_weights, cluster_plan=cplan(a, b, m3_weights_source="shared"),
               hosts={"h200-01": {}, "h200-02": {}})
    assert any(o.name.endswith("(resumable, verified)") for o in run.for_host("h200-01"))
    assert run.for_host("h200-02") == []


# --- preflight role ------------------------------------------------------------------------------

def _device_fact_table(**over) -> dict:
    """Fact classes -> the values captured on the 2x H200 device."""
    t = {host_facts.NvidiaSmi: {"present": True, "gpus": DEVICE["gpus"], "error": ""},
         host_facts.NvidiaDriver: {k: DEVICE["driver"][k] for k in ("version", "flavor", "cuda_version")},
         host_facts.NvidiaTopology: DEVICE["topology"], host_facts.DefaultRouteInterface: "eth0", host_facts.ShmSize: DEVICE["shm"],
         host_facts.OsInfo: DEVICE["os"], host_facts.RebootRequired: DEVICE["reboot"],
         host_facts.FreeSpace: lambda path: {**DEVICE["disk"], "avail_bytes": 900 * 10**9}}
    t.update(over)
    return t


def test_preflight_role_passes_on_the_device_facts(fake):
    assert fake(preflight, facts=_device_fact_table(), host_plan=hplan()).ops == []


def test_preflight_role_defers_gpu_checks_on_a_fresh_host(fake):
    """No driver yet: the drivers role installs it; disk/shm still count."""
    t = _device_fact_table()
    for k in (host_facts.NvidiaSmi, host_facts.NvidiaDriver, host_facts.NvidiaTopology):
        del t[k]
    assert fake(preflight, facts=t, host_plan=hplan()).ops == []


def test_preflight_role_stops_on_missing_gpus_and_names_every_host(fake):
    few = _device_fact_table()
    few[host_facts.NvidiaSmi] = {"present": True, "gpus": DEVICE["gpus"][:1], "error": ""}
    small = _device_fact_table()
    small[host_facts.FreeSpace] = lambda path: {**DEVICE["disk"], "avail_bytes": 10**9}
    a, b = hplan("h200-01"), hplan("h200-02", address="10.0.0.12")
    with pytest.raises(PreflightFailed) as e:
        fake(preflight, cluster_plan=cplan(a, b), hosts={"h200-01": {"facts": few}, "h200-02": {"facts": small}})
    msg = str(e.value)
    assert "preflight failed on 2 hosts" in msg
    assert "@fake/h200-01: gpu-count: 1 GPU found, plan needs 2" in msg
    assert "@fake/h200-02: disk:" in msg and "444 GB" in msg
    with pytest.raises(PreflightFailed, match="gpu-count"):
        fake(preflight, facts=few, host_plan=a, host_data={"m3_preflight_ignore": ["disk"]})
