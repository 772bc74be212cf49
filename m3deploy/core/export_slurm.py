"""The plan as an srt-slurm job (NVIDIA/srt-slurm's `srtctl` recipe YAML): pure, no I/O.

srtctl does not install from the package index, so the recipe is checked offline against the shape its own source
defines (`SCHEMA`, pinned to NVIDIA/srt-slurm commit c88ef731, files named per rule). Each pool's engine flags
become `<engine>_config.<pool>` (kebab-case keys, as srtctl passes them back as `--key value`), its env
`<pool>_environment`; what srtctl decides itself (the nodes' addresses, the multi-node flags, etcd/NATS on the head
node, the frontend's host and port) is left out, as for Kubernetes (m3deploy.core.export_k8s: the same views and
differences). docs/TARGETS.md.
"""
from __future__ import annotations

from typing import Any

from m3deploy.core import export_k8s as ek
from m3deploy.core.model import ClusterPlan

SRT = "NVIDIA/srt-slurm@c88ef731"
SCHEMA_PY = "src/srtctl/core/schema.py"
BACKENDS = {"vllm": "src/srtctl/backends/vllm.py", "sglang": "src/srtctl/backends/sglang.py",
            "trtllm": "src/srtctl/backends/trtllm.py", "mocker": "src/srtctl/backends/mocker.py"}
POOL_KEY = {"prefill": "prefill", "decode": "decode", "worker": "aggregated"}
# the env srtctl's own launch sets per node (the address and the control plane it starts on the head node)
SLURM_DECIDES = {"DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST", "DYN_SYSTEM_HOST",
                 ek.POD_IP, "VLLM_NIXL_SIDE_CHANNEL_HOST"}


def _flags(args: tuple[str, ...]) -> tuple[list[str], dict[str, Any]]:
    """(leading positional args, {kebab-key: value}) from an engine's argv after its module: `--k v` -> k: v,
    a bare `--flag` -> true."""
    head, out, i = [], {}, 0
    while i < len(args) and not args[i].startswith("--"):
        head.append(args[i])
        i += 1
    while i < len(args):
        key = args[i][2:]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[key] = args[i + 1]
            i += 2
        else:
            out[key] = True
            i += 1
    return head, out


def _has_address(value: str) -> bool:
    return f"$({ek.POD_IP})" in value


def recipe(plan: ClusterPlan) -> dict[str, Any]:
    """The srtctl recipe for the plan's Dynamo deployment; M3Error for a plan it cannot carry."""
    ek.refuse(plan)
    workers = [g for g in ek.groups(plan) if g[1] in ("worker", "prefill", "decode") and g[0] != "scripted"]
    first_h, first = workers[0][2][0]
    gpus_per_node = max(first_h.gpus, 1)
    resources: dict[str, Any] = {"gpu_type": first_h.platform or "sim", "gpus_per_node": gpus_per_node}
    backend: dict[str, Any] = {"type": plan.engine if plan.engine in BACKENDS else "mocker"}
    config: dict[str, dict[str, Any]] = {}
    for name, ctype, members in workers:
        hp, svc = members[0]
        v = ek.view(plan, hp, svc)
        pool = POOL_KEY[ctype]
        _, flags = _flags(v.args[2:] if v.args[:1] == ("-m",) else v.args)
        config[pool] = {k: val for k, val in flags.items() if not (isinstance(val, str) and _has_address(val))}
        env = {k: val for k, val in v.env if k not in SLURM_DECIDES and not _has_address(val)}
        backend[f"{pool}_environment"] = env
        per_instance = max(ek.gpus_of(svc), 1) * svc.nnodes
        nodes = -(-len(members) * per_instance // gpus_per_node)  # ceil: instances may share a node
        short = "agg" if pool == "aggregated" else pool
        resources.update({f"{short}_nodes": nodes, f"{short}_workers": len(members)})
        if per_instance != gpus_per_node:
            resources[f"gpus_per_{short}"] = per_instance
    if backend["type"] != "mocker":
        backend[f"{backend['type']}_config"] = config
    fe = next((s for _, s in ek.dynamo_clients(plan) if s.kind == "frontend"), None)
    frontend: dict[str, Any] = {"type": "dynamo", "enable_multiple_frontends": False}
    if fe:
        _, fflags = _flags(fe.argv[3:])
        frontend["args"] = {k: v for k, v in fflags.items() if k not in ("http-host", "http-port")}
    return {
        "name": ek.dns_name(plan.name),
        "model": {"path": plan.model_id, "container": ek.image_of(plan, first), "precision": plan.variant},
        "resources": resources,
        "dynamo": {"install": False, "version": plan.dynamo_version, "request_plane": "tcp", "event_plane": "nats"},
        "frontend": frontend,
        "backend": backend,
        "benchmark": {"type": "manual"},
    }


# srtctl's recipe shape (JSON Schema), from its marshmallow dataclasses: SrtConfig, ModelConfig, ResourceConfig,
# DynamoConfig, FrontendConfig, BenchmarkConfig (SCHEMA_PY) and the backends' Protocols (BACKENDS)
def _pool_configs() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False,
            "properties": {k: {"type": ["object", "null"], "propertyNames": {"pattern": "^[a-z0-9][a-z0-9-]*$"}}
                           for k in ("prefill", "decode", "aggregated")}}


_ENV = {"type": "object", "additionalProperties": {"type": "string"}}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "model", "resources"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "model": {"type": "object", "required": ["path", "container", "precision"], "additionalProperties": False,
                  "properties": {"path": {"type": "string"}, "container": {"type": "string"},
                                 "precision": {"type": "string"}, "stage_dir": {"type": ["string", "null"]}}},
        "resources": {"type": "object", "required": ["gpu_type"], "additionalProperties": False,
                      "properties": {"gpu_type": {"type": "string"}, "gpus_per_node": {"type": "integer", "minimum": 1},
                                     **{k: {"type": ["integer", "null"], "minimum": 0} for k in (
                                         "prefill_nodes", "decode_nodes", "prefill_workers", "decode_workers",
                                         "agg_nodes", "agg_workers", "gpus_per_prefill", "gpus_per_decode",
                                         "gpus_per_agg")},
                                     "spread_workers": {"type": "boolean"}, "het_jobs": {"type": ["boolean", "null"]}}},
        "slurm": {"type": "object"},
        "dynamo": {"type": "object", "additionalProperties": False,
                   "properties": {"install": {"type": "boolean"}, "version": {"type": ["string", "null"]},
                                  "hash": {"type": ["string", "null"]}, "top_of_tree": {"type": "boolean"},
                                  "wheel": {"type": ["string", "null"]},
                                  "request_plane": {"enum": ["nats", "tcp", "http"]},
                                  "event_plane": {"enum": ["nats", "zmq", None]}}},
        "frontend": {"type": "object", "properties": {"type": {"type": "string"},
                                                      "enable_multiple_frontends": {"type": "boolean"},
                                                      "args": {"type": ["object", "null"]}, "env": _ENV}},
        "backend": {"type": "object", "required": ["type"],
                    "properties": {"type": {"enum": ["sglang", "trtllm", "vllm", "mocker"]},
                                   "prefill_environment": _ENV, "decode_environment": _ENV,
                                   "aggregated_environment": _ENV, "vllm_config": _pool_configs(),
                                   "sglang_config": _pool_configs(), "trtllm_config": _pool_configs()}},
        "benchmark": {"type": "object", "properties": {"type": {"type": "string"}}},
        "environment": _ENV,
    },
}


def problems(doc: Any) -> list[str]:
    """The recipe against srtctl's shape, and its cross-field rules: a disaggregated job has prefill and decode
    nodes and workers > 0, an aggregated one agg_workers > 0, not both (SCHEMA_PY SrtConfig validation and
    ResourceConfig.is_disaggregated); `<type>_config` only for its own backend type (SCHEMA_PY BackendConfigField
    loads the type's Protocol, which has no other engine's config)."""
    import jsonschema

    out = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message} [srtctl schema:{e.validator}; "
           f"{SRT} {SCHEMA_PY}]" for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(doc)]
    if out or not isinstance(doc, dict):
        return out
    r, b = doc["resources"], doc.get("backend") or {}
    disagg = bool(r.get("prefill_nodes") or r.get("decode_nodes"))
    if disagg and (r.get("agg_nodes") or r.get("agg_workers")):
        out.append(f"resources: both disaggregated and aggregated nodes [srtctl resources; {SRT} {SCHEMA_PY}]")
    if disagg and not ((r.get("prefill_workers") or 0) > 0 and (r.get("decode_workers") or 0) > 0):
        out.append("resources: Disaggregated mode requires prefill_workers and decode_workers to be > 0. "
                   f"[srtctl resources; {SRT} {SCHEMA_PY}]")
    if not disagg and not (r.get("agg_workers") or 0) > 0:
        out.append(f"resources: Aggregated mode requires agg_workers to be > 0. [srtctl resources; {SRT} {SCHEMA_PY}]")
    for other in ("vllm", "sglang", "trtllm"):
        if f"{other}_config" in b and b.get("type") != other:
            out.append(f"backend.{other}_config: backend.type is {b.get('type')!r} [srtctl backend; {SRT} "
                       f"{BACKENDS.get(b.get('type'), SCHEMA_PY)}]")
    return out


def checked(plan: ClusterPlan) -> tuple[dict[str, Any], list[str]]:
    """(recipe(plan), its problems): what `m3deploy export slurm` writes and `validate --target slurm` reports."""
    doc = recipe(plan)
    return doc, problems(doc)
