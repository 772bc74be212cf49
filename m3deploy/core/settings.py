"""Every `m3_*` data key: its type, its default and what it does, in one place.

The plan (m3deploy.core.build), validation and the roles read keys through `get(data, key)`, so a default is
written once, here. A default of `None` means "not set": the plan or the catalog decides (e.g. the NVIDIA driver
branch comes from the catalog's `vendors.nvidia.driver_branch` unless `m3_nvidia_driver_branch` pins one).
README "Inventory contract" lists the keys a user sets most.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from m3deploy.core import catalog


@dataclass(frozen=True)
class Key:
    name: str
    type: Any  # a type or a tuple of types (None allowed whenever the default is None)
    default: Any
    doc: str
    cluster: bool = False  # one value for the whole cluster (read from the first worker; recorded in the plan)


_KEYS = (
    # what runs
    Key("m3_platform", str, None, "GPU platform of the host (catalog.yaml `platforms`; `sim` = testbed)"),
    Key("m3_variant", str, "bf16", "checkpoint variant (catalog.yaml `variants`)", True),
    Key("m3_parallel", str, "tp8", "one engine instance's parallelism: tp<N>, tp<N>-ep or dp<N>-ep", True),
    Key("m3_engine", str, "vllm", "inference engine: vllm, sglang, trtllm, mocker (engines.yaml)", True),
    Key("m3_serving", str, "standalone", "standalone engines, or dynamo (frontend + KV router)", True),
    Key("m3_features", list, [], "recipe features (catalog.yaml `features`; `no-X` drops a default one)", True),
    Key("m3_max_model_len", int, None, "context cap, tokens (engines.yaml names each engine's flag)", True),
    Key("m3_extra_args", (list, dict), [], "extra engine flags: the last layer", True),
    Key("m3_unset_args", list, [], "engine flags or env names to drop: the last layer", True),
    Key("m3_extra_env", dict, {}, "extra engine env: the last layer", True),
    Key("m3_image", str, None, "override the recipe's engine image", True),
    Key("m3_model_id", str, None, "override the variant's checkpoint", True),
    Key("m3_served_model_name", str, None, "name the API serves the model under (default: the model id)", True),
    Key("m3_state", str, "present", "`absent` tears the deployment down", True),
    Key("m3_cluster", str, None, "cluster name (default: the inventory file's name)"),
    # addresses and ports
    Key("m3_address", str, None, "the host's cluster address (binds, advertised addresses); default ssh_hostname"),
    Key("m3_interface", str, None, "the host's cluster interface (NCCL/GLOO socket interface)"),
    Key("m3_rdma_env", dict, {}, "per-host NCCL/UCX env (e.g. NCCL_IB_HCA); default from the host's facts"),
    Key("m3_frontend_port", int, 8000, "the Dynamo frontend's HTTP port"),
    Key("m3_worker_port", int, 8000, "standalone engines: first worker's HTTP port on a host (+1 per extra worker)"),
    Key("m3_system_port", int, 9090, "Dynamo workers' DYN_SYSTEM_PORT (+1 per worker on a host)"),
    Key("m3_kv_events_port", int, 5200, "Dynamo vLLM workers' ZMQ KV-events publisher (+1 per worker on a host)"),
    Key("m3_master_port", int, 29500, "multi-host rendezvous (SGLang --dist-init-addr)"),
    # Dynamo, paths, engine tuning
    Key("m3_dynamo_version", str, "1.6.1", "ai-dynamo on the controller's wheelhouse, hosts' venv and images", True),
    Key("m3_venv_root", str, "/opt/m3", "hosts' venvs: <root>/dynamo-<version>"),
    Key("m3_hf_cache", str, "/var/lib/m3/hf", "where weights go on GPU hosts; mounted into engine containers"),
    Key("m3_state_dir", str, "/var/lib/m3", "services' state and HOME directories"),
    Key("m3_max_num_seqs", int, 256, "vLLM --max-num-seqs"),
    Key("m3_cudagraph_capture_sizes", list, [1, 2, 4, 8, 16, 32, 64, 128], "vLLM CUDA graph capture sizes"),
    Key("m3_mocker_startup_time", int, 0, "the mocker's simulated model load, seconds"),
    Key("m3_mocker_speedup_ratio", int, 10, "the mocker's speed-up over real time"),
    Key("m3_readiness_timeout_s", int, None, "override the recipe's readiness timeout"),
    Key("m3_gpus_per_host", int, None, "override the platform's GPU count (e.g. a 2-GPU H200 box)"),
    Key("m3_gpu_memory_gb", int, None, "per-GPU memory override (e.g. the 141 GB H20 variant)"),
    Key("m3_auth", bool, True, "etcd and NATS authentication (passwords generated once on the controller)", True),
    Key("m3_nats_max_payload", int, 33554432, "NATS max_payload: long prompts time out below it (Dynamo issue 9734)",
        True),
    Key("m3_keep_caches", bool, False, "teardown keeps the venv, wheelhouse, mock model and weights", True),
    # day 2 (roles/_rollout.py, docs/OPERATIONS.md)
    Key("m3_rollout", str, "rolling", "changed worker units: 'rolling' (one engine instance at a time, drained) or "
        "'all-at-once'", True),
    Key("m3_rollout_max_unavailable", int, 1, "rolling: engine instances drained and restarted together", True),
    # drivers and runtime (roles/drivers.py, roles/runtime.py, roles/_gpu.py)
    Key("m3_nvidia_driver_branch", (str, int), None, "NVIDIA driver branch (default: catalog vendors.nvidia)"),
    Key("m3_nvidia_driver_flavor", str, None, "'open' or 'proprietary' kernel modules (default: catalog)"),
    Key("m3_nvidia_repo_url", str, None, "NVIDIA's CUDA apt repository (default: per Ubuntu release and arch)"),
    Key("m3_fabric_manager", bool, None, "run nvidia-fabricmanager (default: the platform's catalog `fabric`)"),
    Key("m3_imex", bool, None, "run nvidia-imex (default: the platform's catalog `fabric`)"),
    Key("m3_rocm_version", str, None, "minimum ROCm on AMD hosts (default: catalog vendors.amd.rocm)"),
    Key("m3_amdgpu_install_deb", str, None, "URL of amdgpu-install's .deb (default: repo.radeon.com for the ROCm)"),
    Key("m3_amdgpu_usecase", str, "dkms,rocm", "amdgpu-install --usecase"),
    Key("m3_gpu_users", list, [], "users to add to the render and video groups"),
    Key("m3_allow_reboot", bool, False, "reboot a host when a driver change needs it (else stop and name the hosts)"),
    Key("m3_docker_packages", list, ["docker.io"], "the container engine's apt packages (e.g. ['docker-ce'])"),
    # images, weights, preflight
    Key("m3_container_python", str, "3.12", "Python of the engine images (their ai-dynamo wheelhouse)"),
    Key("m3_image_pull", str, "missing", "'missing': pull an image the host lacks; 'always': pull tags every deploy "
        "(digest references never change)", True),
    Key("m3_image_archive_dir", str, None, "controller directory of `docker save` archives (m3deploy save-images)"),
    Key("m3_hf_token_file", str, None, "controller path of a 0600 HF token (else HF_TOKEN from the environment)"),
    Key("m3_hf_cache_shared", bool, False, "the weights cache is one shared filesystem: only the first host downloads"),
    Key("m3_weights_download", str, None, "'image' (`hf` in the worker image) or 'host'; default image when one runs"),
    Key("m3_hf_cli", str, None, "host path of `hf` (default <venv>/bin/hf, else `hf`)"),
    Key("m3_weights_verify", bool, True, "check the downloaded weights' files"),
    Key("m3_preflight_ignore", list, [], "preflight check names not to stop on (e.g. ['disk'])"),
    Key("m3_nccl_min_busbw_gbps", (int, float), 0, "`m3deploy preflight --nccl`: minimum bus bandwidth"),
)
KEYS: dict[str, Key] = {k.name: k for k in _KEYS}
# What the plan reads for the whole cluster, and records in ClusterPlan.settings.
CLUSTER_KEYS = tuple(k.name for k in _KEYS if k.cluster)
DEFAULTS: dict[str, Any] = {k.name: k.default for k in _KEYS}


def get(data: Mapping[str, Any], key: str) -> Any:
    """`data[key]`, or the key's default when it is not set (None)."""
    v = data.get(key)
    return KEYS[key].default if v is None else v


PARALLEL_RE = re.compile(r"^(tp|dp)(\d+)(-ep)?$")


def parse_parallel(mode: str) -> tuple[str, int, bool]:
    """'tp8-ep' -> ('tp', 8, True)."""
    m = PARALLEL_RE.match(str(mode))
    if not m:
        raise ValueError(mode)
    return m.group(1), int(m.group(2)), bool(m.group(3))


def effective_features(features) -> tuple[str, ...]:
    """Defaults (tool-calling, reasoning) plus the user's list; `no-X` removes X. Sorted, unique."""
    feats = list(catalog.catalog()["default_features"])
    for f in features or ():
        f = str(f)
        if f.startswith("no-"):
            feats = [x for x in feats if x != f[3:]]
        elif f not in feats:
            feats.append(f)
    return tuple(feats)
