"""The plan's data model: frozen dataclasses, no pyinfra, no I/O.

Everything a role renders or a check verifies is read from these objects.
`m3deploy.core.build.build()` makes them; `ClusterPlan.to_dict()` is what `m3deploy plan --json` prints.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any


@dataclass(frozen=True)
class Port:
    name: str  # "http", "system", "kv-events", "nixl", "etcd-client", ...
    port: int
    address: str  # the address it binds to (the host's cluster address, or "0.0.0.0" when asked)
    protocol: str = "tcp"
    span: int = 1  # ports it takes from `port` on (vLLM's NIXL side channel: one per TP rank; m3deploy.core.disagg)
    key: str = ""  # the setting it comes from (m3_edge_port, m3_disagg.bootstrap_port, ...); '' when fixed (etcd's)


@dataclass(frozen=True)
class Readiness:
    """How to know a service is ready: polled, never slept."""

    kind: str  # "http" (GET url answers `expect`), "process" (unit active)
    url: str = ""  # for http
    address: str = ""  # for tcp
    port: int = 0  # for tcp
    expect_status: int = 200
    expect_json: tuple[tuple[str, Any], ...] = ()  # e.g. (("health", "true"),) for etcd
    timeout_s: int = 60
    interval_s: float = 0.5


@dataclass(frozen=True)
class Provenance:
    """Which recipe layer set a value (`m3deploy plan --explain`)."""

    key: str  # "--block-size", "env:VLLM_ROCM_USE_AITER", "image", "docker:--ipc"
    value: str | None
    layer: str  # "base", "variant:nvfp4", "platform:gb200", "cluster:m3_extra_args", "facts:rdma"
    source: str  # the file the layer lives in, e.g. "m3deploy/core/data/layers/30-platforms.yaml"
    # the inventory setting a layer's `{placeholder}` or the plan took the value from, and where that was set:
    # "m3_parallel = 'tp8' (group_data/h200.py)", "m3_address (inventories/h200.py)", "m3_edge_frontends (--data)"
    setting: str = ""


@dataclass(frozen=True)
class ModelRepo:
    """A Hugging Face repo workers load (m3deploy.core.repos): staged into every GPU host's HF cache."""

    repo: str  # ORG/NAME
    role: str  # "target" | "draft" | "tokenizer"
    flag: str  # where the plan found it: "m3_model_id", "--speculative-config", "--tokenizer"
    revision: str = "main"


def container_name(service_name: str) -> str:
    """The container a service runs in: its name without `@` (m3-worker@0 -> m3-worker-0)."""
    return service_name.replace("@", "-")


@dataclass(frozen=True)
class Service:
    name: str  # systemd unit name without ".service": "etcd", "nats", "m3-frontend", "m3-worker@0"
    kind: str  # "etcd" | "nats" | "frontend" | "worker"
    host: str
    argv: tuple[str, ...]  # the program's own argv (inside the container when image is set)
    env: tuple[tuple[str, str], ...] = ()  # ordered; written to the 0600 env file
    secret_env: tuple[tuple[str, str], ...] = ()  # (ENV_NAME, secret name); filled on the host from
    #                                               the controller's 0600 secrets, never in the plan
    image: str | None = None  # container image; None = native process
    base_image: str | None = None  # when set, `image` is built on the host FROM base_image + Dynamo wheels (offline)
    docker_args: tuple[str, ...] = ()  # `docker run` flags before the image (vendor device flags, mounts)
    ports: tuple[Port, ...] = ()
    readiness: Readiness | None = None
    after: tuple[str, ...] = ()  # "host/service" that must be ready first
    env_file: str = ""  # /etc/m3/<name>.env
    workdir: str = ""
    # worker-only
    worker: int = -1  # index of the logical worker (engine instance) this rank belongs to
    rank: int = 0  # node rank inside a multi-host worker
    nnodes: int = 1
    devices: tuple[int, ...] = ()  # GPU indices on the host
    provenance: tuple[Provenance, ...] = ()
    # (path, text): config files the command names (TensorRT-LLM's engine YAML): host files written beside the
    # unit (m3deploy.deploy.hostfiles), mounted read-only into the container; a change restarts the service
    files: tuple[tuple[str, str], ...] = ()
    # (path, secret ref): 0600 root host files whose text comes from the controller's secrets store on the host
    # (a secret name, or a text with `{secret-name}` fields, as secret_env): an MPI world's SSH keys
    # (m3deploy.core.mpi); `m3deploy render` masks them, the plan names only the ref
    secret_files: tuple[tuple[str, str], ...] = ()
    # m3_planner: a worker of a `standby` host: installed, never enabled or started by the deploy; the planner's
    # actuator starts and stops it (m3deploy.core.planner)
    standby: bool = False
    # decisions the builders made, read by roles, checks and hostfiles (never parsed back from argv or env);
    # not in `plan --json` (their effect is: the argv, env and files above)
    pool: str = ""  # m3_disagg: the worker's pool, "prefill" | "decode"; "" aggregated (m3deploy.core.disagg)
    mpi: str = ""  # a multi-host worker launched as one MPI world: "launcher" (rank 0) | "follower" (m3deploy.core.mpi)
    frontend_index: int = -1  # a frontend's index on its host: 0 m3-frontend, i m3-frontend-<i> (m3_edge)
    launcher: tuple[str, ...] = ()  # what ExecStart starts with before the command (m3_internal_tls: files/m3-tls-env)
    tls: bool = False  # m3_internal_tls: the service speaks TLS with client certificates (nats.conf's tls blocks)

    @property
    def unit(self) -> str:
        return f"{self.name}.service"

    @property
    def container(self) -> str:
        """The container's name (`docker run --name`): the unit name without `@`, which docker refuses."""
        return container_name(self.name)

    def port(self, name: str) -> Port | None:
        """The port the plan named `name` ("http", "system", "client", ...), or None."""
        return next((p for p in self.ports if p.name == name), None)

    @property
    def entrypoint(self) -> str | None:
        """Containers: the program `docker run --entrypoint` starts (argv[0]), never the image's own ENTRYPOINT."""
        return self.argv[0] if self.image else None

    @property
    def command(self) -> tuple[str, ...]:
        """The full command the unit runs: argv, or `docker run ... --entrypoint argv[0] IMAGE argv[1:]`.

        The entrypoint is always explicit, so the container runs exactly `argv` whatever ENTRYPOINT the image
        declares (vllm/vllm-openai: ["vllm", "serve"]; docs/CONTRACTS.md)."""
        if not self.image:
            return self.argv
        return ("docker", "run", "--rm", "--name", self.container, *self.docker_args,
                "--env-file", self.env_file, "--entrypoint", self.argv[0], self.image,
                *self.argv[1:])

    def shell(self) -> str:
        """Copy-pasteable shell: env exports, then the command, shell-quoted."""
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.env]
        lines += [f"export {k}=<secret:{s}>" for k, s in self.secret_env]
        lines.append(shlex.join(self.argv if self.image else self.command))
        return "\n".join(lines)


@dataclass(frozen=True)
class DriverPlan:
    """What a GPU host's driver must be: the one owner of it, read by roles/drivers.py (installs it) and
    check/preflight (checks it). From the host's data (m3_nvidia_driver_branch, m3_rocm_version, ...), else the
    catalog (`vendors:`, the platform's `fabric:`)."""

    vendor: str  # "nvidia" | "amd"
    branch: int = 0  # NVIDIA: the driver branch installed, and the minimum a loaded driver must have
    flavor: str = ""  # NVIDIA: "open" | "proprietary" kernel modules
    fabric_manager: bool = False  # NVIDIA: run nvidia-fabricmanager (HGX NVSwitch)
    imex: bool = False  # NVIDIA: run nvidia-imex (GB200 NVL72)
    repo_url: str = ""  # NVIDIA: the CUDA apt repository ("" = NVIDIA's, per Ubuntu release and arch)
    rocm: str = ""  # AMD: the ROCm installed, and the minimum (major.minor) an installed one must have
    amdgpu_install_deb: str = ""  # AMD: amdgpu-install's .deb URL ("" = repo.radeon.com's for `rocm`)
    amdgpu_usecase: str = ""  # AMD: amdgpu-install --usecase
    gpu_users: tuple[str, ...] = ()  # AMD: users added to the render and video groups
    allow_reboot: bool = False  # reboot the host when the driver change needs it (else stop, naming it)


@dataclass(frozen=True)
class ImagesPlan:
    """How a host gets its container images (roles/images.py, roles/runtime.py) and what the controller builds for
    them (controller/prepare.py): on hosts that run a container or have GPUs."""

    pull: str = "missing"  # m3_image_pull: "missing" | "always"
    archive_dir: str = ""  # m3_image_archive_dir: the controller's `docker save` archives ("" = pull)
    container_python: str = ""  # m3_container_python: the engine images' Python (their ai-dynamo wheelhouse)
    sim_rootfs: str = ""  # m3_sim_image_rootfs: the stand-in engine image's root filesystem on the controller
    docker_packages: tuple[str, ...] = ()  # m3_docker_packages: the container engine's apt packages


@dataclass(frozen=True)
class WeightsPlan:
    """How a host that holds weights downloads them (roles/weights.py), where the plan gives it a weights_dir."""

    download: str = ""  # "image" (`hf` in the worker image) | "host" (m3_weights_download, else image when one runs)
    verify: bool = True  # m3_weights_verify
    hf_cli: str = ""  # the host's `hf` for download = "host" (m3_hf_cli, else the Dynamo venv's, else `hf`)
    token_file: str = ""  # m3_hf_token_file: the controller's 0600 HF token (else HF_TOKEN from the environment)


@dataclass(frozen=True)
class RolloutPlan:
    """How the deploy restarts changed worker units (roles/rolling.py, roles/workers.py, docs/OPERATIONS.md)."""

    mode: str  # m3_rollout: "rolling" (engine instances drained and restarted in turn) | "all-at-once"
    max_unavailable: int  # m3_rollout_max_unavailable: engine instances drained and restarted together


@dataclass(frozen=True)
class NatsPlan:
    """The cluster's NATS (roles/nats.py ships nats.conf from it, deploy/hostfiles.py renders it): Dynamo only."""

    max_payload: int  # m3_nats_max_payload: bytes (long prompts time out below Dynamo's need, issue 9734)
    cluster_name: str  # the NATS cluster's name when the control hosts run it as one (routes between nodes)


@dataclass(frozen=True)
class HostPlan:
    name: str  # inventory name
    address: str  # cluster address (binds, advertised addresses, --master-addr)
    groups: tuple[str, ...]  # "control", "workers"
    platform: str = ""  # "h200", "gb200", "mi355x", "sim", "" for control-only hosts
    gpu_vendor: str = ""  # "nvidia" | "amd" | "" (control / sim)
    gpu_model: str = ""  # what the facts must report, e.g. "NVIDIA H200", "AMD Instinct MI355X"
    gpus: int = 0  # GPUs this host must have
    gpu_memory_gb: int = 0
    interface: str = ""  # cluster interface (NCCL/GLOO socket ifname) when known
    weights_dir: str = ""  # where weights go on this host (the HF cache the containers mount)
    weights_gb: int = 0  # disk needed for the variant's weights
    shm_min_gb: int = 0
    needs_rdma: bool = False  # a worker on this host spans hosts
    driver: DriverPlan | None = None  # GPU hosts: the driver they must run
    images: ImagesPlan | None = None  # hosts that run a container or have GPUs
    weights: WeightsPlan | None = None  # hosts with a weights_dir
    preflight_ignore: tuple[str, ...] = ()  # m3_preflight_ignore: preflight checks that do not stop the deploy
    services: tuple[Service, ...] = ()  # in start order
    data: tuple[tuple[str, Any], ...] = ()  # the m3_* data the plan read for this host (for reports)

    def service(self, name: str) -> Service:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(f"host {self.name} has no service {name!r}")


@dataclass(frozen=True)
class WorkerPlan:
    """One engine instance (one `vllm serve`/`dynamo.vllm`/mocker), possibly over several hosts."""

    index: int
    hosts: tuple[str, ...]  # rank order; hosts[0] is rank 0
    tensor_parallel: int
    data_parallel: int
    gpus_per_rank: int
    services: tuple[str, ...]  # "host/service" per rank


@dataclass(frozen=True)
class ClusterPlan:
    name: str  # cluster name (inventory file stem)
    platform: str
    variant: str
    parallel: str
    engine: str
    serving: str  # "standalone" | "dynamo"
    features: tuple[str, ...]
    model_id: str  # the checkpoint (HF repo id)
    served_model_name: str  # the name clients send
    max_model_len: int | None
    state: str  # "present" | "absent"
    hosts: tuple[HostPlan, ...]  # inventory order
    workers: tuple[WorkerPlan, ...]
    endpoint: str  # the OpenAI base URL clients use (frontend, or worker 0 for standalone)
    etcd_endpoints: str = ""
    nats_server: str = ""
    dynamo_version: str = ""
    venv: str = ""  # native venv path on hosts (Dynamo frontend/mocker)
    model_dir: str = ""  # local model directory on hosts (mocker) or HF cache dir
    model_repos: tuple[ModelRepo, ...] = ()  # every HF repo any worker loads (target first); all staged offline
    rollout: RolloutPlan | None = None  # how changed worker units restart
    nats: NatsPlan | None = None  # Dynamo: the NATS settings
    settings: tuple[tuple[str, Any], ...] = ()  # every resolved m3_* setting, for reports
    generation: Any = None  # Dynamo: the workers' generation (core/generation.Generation; issue 38)

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in cluster {self.name}")

    def setting(self, key: str) -> Any:
        """A cluster key's one value (settings.CLUSTER_KEYS, as the plan resolved it): what roles read instead of
        a host's own data, which may lack a key another group set."""
        for k, v in self.settings:
            if k == key:
                return v
        raise KeyError(f"{key} is not a cluster setting of the plan")

    def group(self, group: str) -> tuple[HostPlan, ...]:
        return tuple(h for h in self.hosts if group in h.groups)

    def first(self, kind: str) -> tuple[HostPlan, Service] | None:
        """The first service of this kind in host order, with its host (None if the plan has none)."""
        return next(((h, s) for h in self.hosts for s in h.services if s.kind == kind), None)

    def to_dict(self, provenance: bool = False) -> dict[str, Any]:
        """Plain data for `m3deploy plan --json` (provenance only when asked: it is the bulk)."""
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in ("hosts", "workers")}
        out["settings"] = {k: _plain(v) for k, v in self.settings}
        out["workers"] = [_plain(w) for w in self.workers]
        out["hosts"] = {h.name: _host_dict(h, provenance) for h in self.hosts}
        return out


def _host_dict(h: HostPlan, provenance: bool) -> dict[str, Any]:
    d = {f.name: _plain(getattr(h, f.name)) for f in fields(h) if f.name not in ("services", "data")}
    d["data"] = {k: _plain(v) for k, v in h.data}
    d["services"] = [_service_dict(s, provenance) for s in h.services]
    return d


def _service_dict(s: Service, provenance: bool) -> dict[str, Any]:
    r = s.readiness
    return {
        "name": s.name, "unit": s.unit, "kind": s.kind, "host": s.host, "image": s.image, "entrypoint": s.entrypoint,
        "base_image": s.base_image,
        "argv": list(s.argv), "env": dict(s.env), "secret_env": dict(s.secret_env), "docker_args": list(s.docker_args),
        "command": list(s.command),
        "ports": [{"name": p.name, "port": p.port, "address": p.address, "protocol": p.protocol} for p in s.ports],
        "readiness": None if r is None else {
            "kind": r.kind, "url": r.url, "address": r.address, "port": r.port, "expect_status": r.expect_status,
            "expect_json": dict(r.expect_json), "timeout_s": r.timeout_s, "interval_s": r.interval_s},
        "after": list(s.after), "env_file": s.env_file, "workdir": s.workdir, "worker": s.worker, "rank": s.rank,
        "nnodes": s.nnodes, "devices": list(s.devices), **({"files": dict(s.files)} if s.files else {}),
        **({"secret_files": dict(s.secret_files)} if s.secret_files else {}),
        **({"standby": True} if s.standby else {}),
        **({"provenance": [{"key": p.key, "value": p.value, "layer": p.layer, "source": p.source,
                            **({"setting": p.setting} if p.setting else {})}
                           for p in s.provenance]} if provenance else {}),
    }


def _plain(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


__all__ = ["container_name", "DriverPlan", "ImagesPlan", "WeightsPlan", "RolloutPlan", "NatsPlan", "ModelRepo", "Port",
           "Readiness", "Provenance",
           "Service", "HostPlan", "WorkerPlan", "ClusterPlan", "field"]
