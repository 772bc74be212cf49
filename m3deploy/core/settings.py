"""Every `m3_*` data key: its type, its default, its allowed values and what it does, in one place: the schema.

m3deploy.core.inputs checks every host's data against it before the plan is built (unknown keys, types,
`Key.check` rules); docs/INVENTORY.md's key table is `markdown_table()`.

The plan (m3deploy.core.build), validation and the roles read keys through `get(data, key)`, so a default is
written once, here. A default of `None` means "not set": the plan or the catalog decides (e.g. the NVIDIA driver
branch comes from the catalog's `vendors.nvidia.driver_branch` unless `m3_nvidia_driver_branch` pins one).
docs/INVENTORY.md "The keys set most" lists the keys a user sets most.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from m3deploy.core import catalog


@dataclass(frozen=True)
class Key:
    name: str
    type: Any  # a type or a tuple of types (None allowed whenever the default is None)
    default: Any
    doc: str
    cluster: bool = False  # one value for the whole cluster: set on any host, or group, it is every host's (the
    #                        hosts that set it must agree: validate.cluster_keys_agree); recorded in the plan
    check: str = ""  # what m3deploy.core.inputs checks beyond the type (see CHECKS), e.g. "port", "path:teardown"
    values: tuple = ()  # allowed values, when a fixed set
    range: tuple = ()  # (min, max) of a number, inclusive
    omit_unset: bool = False  # a cluster key the plan records only when set to another value than its default (so
    #                           that adding it changed no plan)

    def parse(self, value: Any) -> tuple[Any, str]:
        """(the value as the plan reads it, "" ) or (value, why it is not this key's type). Booleans parse
        strictly (True/False, or the strings and numbers true/false/yes/no/on/off/1/0, as CSVs and `--data`
        carry them); whole numbers also from a string of digits ("141", not "141GB")."""
        if value is None:
            return value, ""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if bool in types:
            if isinstance(value, bool):
                return value, ""
            b = _BOOLS.get(str(value).strip().lower()) if isinstance(value, (str, int)) else None
            if b is None:
                return value, f"{value!r} is not a boolean. Fix: {self.name} = True or False"
            return b, ""
        if int in types and not isinstance(value, bool):
            if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
                value = int(value.strip())
            if isinstance(value, int) or (float in types and isinstance(value, float)):
                lo, hi = self.range or (None, None)
                if (lo is not None and value < lo) or (hi is not None and value > hi):
                    return value, f"{value} is out of range {lo}..{hi}"
                return value, ""
            if str not in types:
                return value, (f"{value!r} is not a whole number. Fix: {self.name} = <number>, no unit or "
                               f"separators (e.g. {self.default if self.default is not None else 141})")
        if isinstance(value, types) and not isinstance(value, bool):
            if self.values and value not in self.values:
                return value, f"{value!r} is not one of {', '.join(map(repr, self.values))}"
            return value, ""
        want = " or ".join(t.__name__ for t in types)
        return value, f"expected {want}, got {type(value).__name__} {value!r}"


_KEYS = (
    # what runs
    Key("m3_platform", str, None, "GPU platform of the host (catalog.yaml `platforms`; `sim` = testbed)"),
    Key("m3_variant", str, "bf16", "checkpoint variant (catalog.yaml `variants`)", True),
    Key("m3_parallel", str, "tp8", "one engine instance's parallelism: tp<N>, tp<N>-ep or dp<N>-ep", True),
    Key("m3_engine", str, "vllm", "inference engine: vllm, sglang, trtllm, mocker (engines.yaml)", True),
    Key("m3_serving", str, "standalone", "standalone engines, or dynamo (frontend + KV router)", True),
    Key("m3_features", list, [], "recipe features (catalog.yaml `features`; `no-X` drops a default one)",
        True, check="names"),
    Key("m3_max_model_len", int, None, "context cap, tokens, <= 1048576 (engines.yaml names each engine's flag); "
        "on the testbed's vLLM CPU build, <= its tiny model's window (engines.yaml vllm cpu: max_context)", True),
    Key("m3_extra_args", (list, dict), [], "extra engine flags: the last layer (no secrets: --api-key is refused)",
        True, check="args"),
    Key("m3_unset_args", list, [], "engine flags or env names to drop: the last layer (not a flag the plan sets)",
        True, check="names"),
    Key("m3_extra_env", dict, {}, "extra engine env: the last layer (no name with a TOKEN/KEY/PASSWORD/SECRET word)",
        True, check="env"),
    Key("m3_image", str, None,
        "override the recipe's engine image (a version tag or a digest: floating tags are refused)", True,
        check="image"),
    Key("m3_model_id", str, None, "override the variant's checkpoint", True, check="repo_id"),
    Key("m3_served_model_name", str, None, "name the API serves the model under (default: the model id)", True),
    Key("m3_state", str, "present", "`absent` tears the deployment down", True, values=("present", "absent")),
    Key("m3_cluster", str, None, "cluster name (default: the inventory file's name)", check="name", cluster=True),
    # addresses and ports
    Key("m3_address", str, None, "the host's cluster address (binds, advertised addresses); default ssh_hostname",
        check="ip"),
    Key("m3_rack", int, None, "informational: the host's rack (GB200 NVL72); not read by the deploy"),
    Key("m3_tray", int, None, "informational: the host's tray in its rack; not read by the deploy"),
    Key("m3_interface", str, None, "the host's cluster interface (NCCL/GLOO socket interface)", check="ifname"),
    Key("m3_rdma_env", dict, {}, "per-host NCCL/UCX env (e.g. NCCL_IB_HCA); default from the host's facts",
        check="env"),
    Key("m3_frontend_port", int, 8000, "the Dynamo frontend's HTTP port", check="port", cluster=True),
    Key("m3_worker_port", int, 8000, "standalone engines: first worker's HTTP port on a host (+1 per extra worker)",
        check="port", cluster=True),
    Key("m3_system_port", int, 9090, "Dynamo workers' DYN_SYSTEM_PORT (+1 per worker on a host)", check="port",
        cluster=True),
    Key("m3_kv_events_port", int, 5200, "Dynamo vLLM workers' ZMQ KV-events publisher (+1 per worker on a host)",
        check="port", cluster=True),
    Key("m3_master_port", int, 29500, "multi-host rendezvous (SGLang --dist-init-addr)", check="port", cluster=True),
    # Dynamo, paths, engine tuning
    Key("m3_dynamo_version", str, "1.6.1", "ai-dynamo on the controller's wheelhouse, hosts' venv and images",
        True, check="version"),
    Key("m3_venv_root", str, "/opt/m3", "hosts' venvs: <root>/dynamo-<version>", check="path:teardown", cluster=True),
    Key("m3_hf_cache", str, "/var/lib/m3/hf", "where weights go on GPU hosts; mounted into engine containers",
        check="path:teardown", cluster=True),
    Key("m3_state_dir", str, "/var/lib/m3", "services' state and HOME directories", check="path:teardown",
        cluster=True),
    Key("m3_max_num_seqs", int, 256, "vLLM --max-num-seqs", range=(1, 1 << 20), cluster=True),
    Key("m3_cudagraph_capture_sizes", list, [1, 2, 4, 8, 16, 32, 64, 128], "vLLM CUDA graph capture sizes",
        check="ints", cluster=True),
    Key("m3_mocker_startup_time", int, 0, "the mocker's simulated model load, seconds", range=(0, 86400), cluster=True),
    Key("m3_mocker_speedup_ratio", (int, float), 10, "the mocker's speed-up over real time", range=(1, 1 << 20),
        cluster=True),
    Key("m3_mocker_engine_type", str, None, "the mocker's --engine-type: whose scheduler and KV cache it simulates "
        "(unset: the mocker's own default, vllm)", True, values=("vllm", "sglang", "trtllm")),
    Key("m3_readiness_timeout_s", int, None, "override the recipe's readiness timeout", range=(1, 7 * 86400),
        cluster=True),
    Key("m3_gpus_per_host", int, None, "override the platform's GPU count (e.g. a 2-GPU H200 box)", range=(1, 64)),
    Key("m3_gpu_memory_gb", int, None, "per-GPU memory override (e.g. the 141 GB H20 variant)", range=(1, 4096)),
    Key("m3_auth", bool, True, "etcd and NATS authentication (passwords generated once on the controller)", True),
    Key("m3_etcd_lease_ttl", int, 120, "TTL (s) of every Dynamo process's etcd lease (Dynamo's ETCD_LEASE_TTL, "
        "whose own default is 30 s): 120 rides out an etcd outage of 60 s (docs/OPERATIONS.md)", True,
        range=(10, 3600)),
    Key("m3_nats_max_payload", int, 33554432, "NATS max_payload: long prompts time out below it (Dynamo issue 9734)",
        True, range=(1024, 64 << 20)),
    Key("m3_keep_caches", bool, False, "teardown keeps the venv, wheelhouse, mock model and weights", True),
    # observability (m3deploy.core.monitor, roles/monitor.py, docs/OBSERVE.md)
    Key("m3_monitor", bool, False, "Prometheus (on the `monitor` group's first host, else the first control host), "
        "node-exporter on every host, the NATS and GPU exporters, rules; `m3deploy status` reads it", True),
    Key("m3_prometheus_port", int, 9190, "Prometheus's HTTP port on the monitor host (9090 is the workers' "
        "DYN_SYSTEM_PORT)", True, check="port"),
    Key("m3_node_exporter_port", int, 9100, "prometheus-node-exporter's port on every host", True, check="port"),
    Key("m3_nats_exporter_port", int, 7777, "the NATS exporter's port on NATS hosts (files/m3-nats-exporter.py)",
        True, check="port"),
    Key("m3_monitor_scrape_interval_s", int, 15, "Prometheus scrape and rule evaluation interval, seconds", True,
        range=(1, 3600)),
    Key("m3_prometheus_retention_time", str, "15d", "Prometheus keeps samples this long (--storage.tsdb.retention"
        ".time: <number><y|w|d|h|m|s>)", True, check="duration"),
    Key("m3_prometheus_retention_size", str, "10GB", "Prometheus's disk bound (--storage.tsdb.retention.size: "
        "<number><B|KB|MB|GB|TB>)", True, check="bytesize"),
    Key("m3_alert_ttft_p99_s", (int, float), 10, "SLA: alert M3TimeToFirstTokenHigh fires when the frontend's time "
        "to first token p99 stays above this many seconds for 5 min", True, range=(0.001, 86400)),
    # day 2 (roles/rolling.py, docs/OPERATIONS.md)
    Key("m3_rollout", str, "rolling", "changed worker units: 'rolling' (one engine instance at a time, drained) or "
        "'all-at-once'", True, values=("rolling", "all-at-once")),
    Key("m3_rollout_max_unavailable", int, 1, "rolling: engine instances drained and restarted together", True,
        range=(1, 1 << 16)),
    # drivers and runtime (roles/drivers.py, roles/runtime.py, roles/gpuhost.py)
    Key("m3_nvidia_driver_branch", (str, int), None, "NVIDIA driver branch (default: catalog vendors.nvidia)",
        check="branch"),
    Key("m3_nvidia_driver_flavor", str, None, "'open' or 'proprietary' kernel modules (default: catalog)",
        values=("open", "proprietary")),
    Key("m3_nvidia_repo_url", str, None, "NVIDIA's CUDA apt repository (default: per Ubuntu release and arch)",
        check="url"),
    Key("m3_fabric_manager", bool, None, "run nvidia-fabricmanager (default: the platform's catalog `fabric`)"),
    Key("m3_imex", bool, None, "run nvidia-imex (default: the platform's catalog `fabric`)"),
    Key("m3_rocm_version", str, None, "minimum ROCm on AMD hosts (default: catalog vendors.amd.rocm)",
        check="version"),
    Key("m3_amdgpu_install_deb", str, None, "URL of amdgpu-install's .deb (default: repo.radeon.com for the ROCm)",
        check="url"),
    Key("m3_amdgpu_usecase", str, "dkms,rocm", "amdgpu-install --usecase"),
    Key("m3_gpu_users", list, [], "users to add to the render and video groups", check="users"),
    Key("m3_allow_reboot", bool, False, "reboot a host when a driver change needs it (else stop and name the hosts)"),
    Key("m3_docker_packages", list, ["docker.io"], "the container engine's apt packages (e.g. ['docker-ce'])",
        check="packages"),
    # images, weights, preflight
    Key("m3_container_python", str, "3.12", "Python of the engine images (their ai-dynamo wheelhouse)",
        check="version"),
    Key("m3_image_pull", str, "missing", "'missing': pull an image the host lacks; 'always': pull tags every deploy "
        "(digest references never change)", True, values=("missing", "always")),
    Key("m3_runtime", str, "native", "mocker workers: 'native' (the Dynamo venv) or 'docker' (the stand-in engine "
        "image, `docker run` as GPU workers)", True, values=("native", "docker")),
    Key("m3_sim_image_rootfs", str, None, "m3_runtime=docker: controller directory of the stand-in image's root "
        "filesystem (inventories/testbed.py: the testbed's image)"),
    Key("m3_image_archive_dir", str, None, "controller directory of `docker save` archives (m3deploy save-images)"),
    Key("m3_hf_token_file", str, None, "controller path of a 0600 HF token (else HF_TOKEN from the environment)"),
    Key("m3_api_key_file", str, None, "controller path of a 0600 file holding the API key every client must send "
        "(`Authorization: Bearer`); standalone vLLM, or Dynamo with m3_edge (then one key per line, all valid: a "
        "key rotates by a re-run; clients send the first; docs/CONTRACTS.md)", True),
    # the edge (m3deploy.core.edge, roles/edge.py, docs/OPERATIONS.md "The edge")
    Key("m3_edge", bool, False, "Dynamo: HAProxy on each control host in front of the frontends (TLS, API keys, "
        "health checks, drained frontend restarts); the plan's endpoint becomes the edge's", True),
    Key("m3_edge_port", int, 8443, "the edge's HTTPS port on the control hosts' cluster addresses", True,
        check="port"),
    Key("m3_edge_frontends", int, 2, "with the edge: frontend processes per control host (m3-frontend, "
        "m3-frontend-1, ...; ports from m3_frontend_port): a restart of one is drained while another serves",
        True, range=(1, 8)),
    Key("m3_edge_timeout_server_s", int, 3600, "the edge's `timeout server` (and client), seconds: a non-streaming "
        "request gets no byte until its whole answer is made (a 64K-token answer at 30 tokens/s: ~36 min); a stream "
        "is bounded only by its gaps (docs/OPERATIONS.md \"The edge\")", True, range=(60, 7 * 86400)),
    Key("m3_edge_retry_body_kb", int, 64, "the edge's buffer (HAProxy tune.bufsize), KB: a request (headers and body) "
        "up to this less 1 KB is retried on another frontend after a 404/500/503; a larger one gets the frontend's "
        "answer; each connection holds two buffers (docs/OPERATIONS.md \"The edge\")", True, range=(16, 1024)),
    Key("m3_vip", str, None, "with the edge and 3 control hosts: one address for the cluster, 'ADDRESS/PREFIX' in "
        "the control hosts' subnet that no host has; keepalived's VRRP moves it to a control host whose edge is "
        "healthy, and the endpoint becomes it (m3deploy.core.vip; docs/OPERATIONS.md)", True, omit_unset=True),
    Key("m3_vip_router_id", int, None, "m3_vip's VRRP router id (1..255), unique on the segment; default the "
        "address's last octet", True, range=(1, 255), omit_unset=True),
    # disaggregated prefill/decode (m3deploy.core.disagg, docs/DISAGG.md)
    Key("m3_disagg", dict, {}, "Dynamo: prefill and decode pools instead of aggregated workers, e.g. {'prefill': "
        "{'workers': 1, 'parallel': 'tp4'}, 'decode': {'workers': 1, 'parallel': 'tp4'}}; per pool also 'args', "
        "'env', 'unset', 'readiness_timeout_s'; ports 'bootstrap_port' (8998), 'nixl_side_channel_port' (5600); "
        "mocker: 'kv_transfer_bandwidth' (GB/s), 'kv_bytes_per_token'. Absent: aggregated (docs/DISAGG.md)", True,
        check="disagg", omit_unset=True),
    Key("m3_disagg_role", str, None, "m3_disagg: the host's pool (else hosts join the pools in rank order, prefill "
        "first)", values=("prefill", "decode")),
    Key("m3_planner", dict, {}, "Dynamo: the SLA planner (environment virtual) on the first control host and "
        "m3deploy's actuator, which starts and drains the `standby` group's prepared workers, e.g. {'max': 3, "
        "'cooldown_s': 60, 'ttft_ms': 500}; also 'min', 'itl_ms', 'interval_s', 'optimization_target', "
        "'profile_data' (docs/PLANNER.md)", True, check="planner", omit_unset=True),
    Key("m3_internal_tls", bool, False, "Dynamo: TLS with client certificates of the cluster CA for etcd (clients "
        "and peers) and NATS (clients and routes); clients without a certificate are refused "
        "(m3deploy.core.internal_tls)", True),
    Key("m3_tls_cert_file", str, None, "the edge's certificate chain (PEM, controller path, 0600); default: one "
        "signed by the cluster CA the controller makes (m3deploy.controller.tls)", True),
    Key("m3_tls_key_file", str, None, "the private key of m3_tls_cert_file (PEM, controller path, 0600)", True),
    Key("m3_tls_ca_file", str, None, "with m3_tls_cert_file: the CA (PEM) our clients trust for the edge; default "
        "the system's trust store", True),
    # certificates over the cluster's life (m3deploy.controller.certs, docs/OPERATIONS.md "Certificates over the
    # cluster's life"): recorded in the plan only when set to another value than the default
    Key("m3_cert_renew_days", int, 30, "the renewal window: a deploy re-issues (and rolls out) every certificate of "
        "the cluster CA with this many days left or fewer, and starts the CA's rotation when it has fewer than this "
        "plus m3_cert_validity_days left; `m3deploy verify` fails inside it; validate refuses the user's "
        "m3_tls_cert_file inside it", True, range=(1, 3650), omit_unset=True),
    Key("m3_cert_validity_days", int, 730, "days a certificate of the cluster CA (edge, etcd, NATS, clients) is "
        "valid when made; for drills and tests (one below m3_cert_renew_days is inside the window when made)", True,
        range=(1, 3650), omit_unset=True),
    Key("m3_ca_validity_days", int, 3650, "days a new cluster CA is valid; for drills and tests", True,
        range=(1, 36500), omit_unset=True),
    Key("m3_weights_source", str, "hub", "where each model repo comes from: 'hub' (every host downloads), "
        "'controller' (its HF cache, then fan-out), 'mirror:<host>' (that host downloads once, then fan-out), "
        "'shared' (one shared filesystem: one host downloads); docs/WEIGHTS.md", True, check="weights_source"),
    Key("m3_weights_fanout", int, 4, "fan-out degree: a host holding a repo sends it to at most this many hosts "
        "per round (rounds = ceil(log_(k+1)(hosts+1)))", True, range=(1, 4096)),
    Key("m3_weights_controller_cache", str, None, "m3_weights_source=controller: the controller's HF cache "
        "(HF_HOME; default $HF_HOME, else ~/.cache/huggingface)", True),
    Key("m3_mock_repo_mb", int, None, "testbed: the controller builds mock repos of this many MB (seeded random "
        "shards, m3deploy.controller.mockrepos) for the plan's repos and stages them (needs source controller)",
        True, range=(1, 1 << 20)),
    Key("m3_weights_download", str, None, "'image' (`hf` in the worker image) or 'host'; default image when one runs",
        values=("image", "host")),
    Key("m3_hf_cli", str, None, "host path of `hf` (default <venv>/bin/hf, else `hf`)", check="path"),
    Key("m3_weights_verify", bool, True, "check the downloaded weights' files"),
    Key("m3_preflight_ignore", list, [], "preflight check names not to stop on (e.g. ['disk'])", check="names"),
    Key("m3_nccl_min_busbw_gbps", (int, float), 0, "`m3deploy preflight --nccl`: minimum bus bandwidth",
        range=(0, 100000)),
)
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
KEYS: dict[str, Key] = {k.name: k for k in _KEYS}
# What the plan reads for the whole cluster, and records in ClusterPlan.settings.
CLUSTER_KEYS = tuple(k.name for k in _KEYS if k.cluster)
DEFAULTS: dict[str, Any] = {k.name: k.default for k in _KEYS}


def get(data: Mapping[str, Any], key: str) -> Any:
    """`data[key]`, or the key's default when it is not set (None)."""
    v = data.get(key)
    return KEYS[key].default if v is None else KEYS[key].parse(v)[0]


def cluster_settings(ref: Mapping[str, Any], datas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every key's value as the plan reads it for the whole cluster: a cluster key (`Key.cluster`) is the value of
    the first host in `datas` that sets it (validate.cluster_keys_agree refuses hosts that set it differently),
    else its default, so a cluster key set only in group_data/control.py is the cluster's; any other key is
    `ref`'s (the first worker: what every worker shares, e.g. its platform)."""
    out = {k: get(ref, k) for k in DEFAULTS}
    for k in CLUSTER_KEYS:
        out[k] = next((get(d, k) for d in datas if d.get(k) is not None), KEYS[k].default)
    return out


CHECKS = {  # what each Key.check means (m3deploy.core.inputs enforces it); the docs table shows it
    "port": "TCP port 1024-65535, not 22, distinct on a host",
    "ip": "an IPv4 or IPv6 literal, not 0.0.0.0 or ::, one per host",
    "path:teardown": "absolute path in a directory m3 owns (a component named m3, m3-*, *-m3): teardown deletes it",
    "path": "absolute host path",
    "env": "{NAME: value}, NAME = [A-Za-z_][A-Za-z0-9_]*, no secret names, NAME=value < 64 KiB",
    "args": "no secret flags (--api-key, --*-token, --password), no flag the plan sets (engines.yaml), each < 128 KiB",
    "image": "a docker image reference: [registry[:port]/]name[:tag][@digest], names lower case",
    "repo_id": "a Hugging Face repo id ORG/NAME (no path, no URL: the weights role stages repos)",
    "names": "list of strings",
    "ints": "list of positive whole numbers",
    "name": "letters, digits, . _ -",
    "ifname": "interface name (1-15 characters)",
    "version": "a version, e.g. 1.6.1",
    "branch": "a driver branch number, e.g. 580",
    "url": "an http(s):// URL",
    "users": "list of user names",
    "packages": "list of apt package names",
    "weights_source": "hub, controller, shared, or mirror:<host> naming an inventory host",
    "duration": "a Prometheus duration, e.g. 15d, 12h, 1w",
    "bytesize": "a Prometheus size, e.g. 10GB, 512MB",
    "disagg": "{'prefill': {...}, 'decode': {...}} with the pool keys of docs/DISAGG.md",
    "planner": "{'min', 'max', 'cooldown_s', 'ttft_ms', 'itl_ms', 'interval_s', 'optimization_target', "
               "'profile_data'} (docs/PLANNER.md)",
}
# Keys that were replaced: the input check names the new spelling (m3deploy.core.inputs.did_you_mean).
RENAMED = {"m3_hf_cache_shared": "m3_weights_source = 'shared'"}
_FROM_CATALOG = {"m3_platform": "platforms", "m3_variant": "variants", "m3_engine": "engines",
                 "m3_serving": "servings", "m3_features": "features", "m3_parallel": "parallel_modes"}


def allowed(key: Key) -> str:
    """The values a key accepts, in words (docs/INVENTORY.md's table)."""
    if key.name in _FROM_CATALOG:
        return ", ".join(map(str, catalog.catalog()[_FROM_CATALOG[key.name]]))
    if key.values:
        return ", ".join(map(str, key.values))
    parts = [CHECKS[key.check]] if key.check else []
    if key.range:
        parts.append(f"{key.range[0]}..{key.range[1]}")
    return "; ".join(parts)


def _cell(v) -> str:
    return str(v).replace("|", "\\|")


def _type_name(t) -> str:
    return " or ".join(x.__name__ for x in (t if isinstance(t, tuple) else (t,)))


def markdown_table() -> str:
    """Every key as a Markdown table: docs/INVENTORY.md holds it verbatim (tests/unit/test_bad_inputs.py)."""
    rows = ["| key | type | default | allowed | scope | meaning |", "|---|---|---|---|---|---|"]
    for k in _KEYS:
        default = "" if k.default is None else f"`{k.default!r}`"
        rows.append(f"| `{k.name}` | {_type_name(k.type)} | {_cell(default)} | {_cell(allowed(k))} | "
                    f"{'cluster' if k.cluster else 'host'} | {_cell(k.doc)} |")
    return "\n".join(rows) + "\n"


# The keys users set most: docs/INVENTORY.md's first table (between <!-- keys:start --> and <!-- keys:end -->).
README_KEYS = ("m3_platform", "m3_variant", "m3_parallel", "m3_engine", "m3_serving", "m3_features",
               "m3_max_model_len", "m3_extra_args", "m3_unset_args", "m3_extra_env", "m3_image", "m3_model_id",
               "m3_served_model_name", "m3_address", "m3_interface", "m3_gpus_per_host", "m3_gpu_memory_gb",
               "m3_frontend_port", "m3_dynamo_version", "m3_hf_cache", "m3_hf_token_file", "m3_api_key_file",
               "m3_allow_reboot",
               "m3_readiness_timeout_s", "m3_state")


def readme_table() -> str:
    """README_KEYS as key | values | meaning, from the same schema as markdown_table()."""
    rows = ["| key | values | meaning |", "|---|---|---|"]
    for name in README_KEYS:
        k = KEYS[name]
        rows.append(f"| `{k.name}` | {_cell(allowed(k) or _type_name(k.type))} | {_cell(k.doc)} |")
    return "\n".join(rows) + "\n"


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
