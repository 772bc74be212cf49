"""Disaggregated prefill/decode serving under Dynamo (m3_disagg): the pools, their hosts, their flags.

Pure plan data, no I/O. `m3_disagg` absent (or `{}`) is aggregated serving, the plan unchanged. With it, e.g.

    m3_disagg = {"prefill": {"workers": 1, "parallel": "tp4"}, "decode": {"workers": 1, "parallel": "tp4"}}

the worker hosts form two pools: a host with `m3_disagg_role` joins that pool; the others join in rank order
(inventory order), prefill first, each pool taking the hosts its workers need (core.layout). Each pool has its
own parallelism (`parallel`, default m3_parallel), its own flags (`args`, `env`, `unset`: a layer over the
cluster's overrides, provenance `cluster:m3_disagg.<pool>`) and its own readiness (`readiness_timeout_s`).

What the engines read is data, not code here: the recipe layers in data/layers/65-disagg.yaml match the rank's
`disagg` context (`prefill` | `decode`; `agg` when aggregated) and fill `{bootstrap_port}`,
`{nixl_side_channel_port}`, `{kv_transfer_bandwidth}`, `{kv_bytes_per_token}` from `ctx()`; an engine that cannot
disaggregate MiniMax-M3 says why in engines.yaml (`disagg_refused:`). The frontend needs nothing more than the KV
router it already runs: Dynamo 1.6.1 finds the topology from the workers' registrations (a prefill worker
registers ModelType.Prefill at `<ns>.prefill.generate`; dynamo/common/configuration/groups/router_args.py:
`--enforce-disagg` is "deprecated and ignored; disaggregated routing topology and readiness are determined
automatically from registered worker types"), and the bootstrap path needs `--router-mode kv` (other modes "fall
back to the synchronous prefill path", the same file's --router-mode help).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from m3deploy.core import catalog, layout, settings
from m3deploy.core.errors import plural
from m3deploy.core.model import Port

POOLS = ("prefill", "decode")
# a pool's keys: type, what it means (docs/INVENTORY.md "m3_disagg")
POOL_KEYS: dict[str, tuple[Any, str]] = {
    "workers": (int, "engine instances in the pool (default 1)"),
    "parallel": (str, "the pool's parallelism, as m3_parallel (default m3_parallel)"),
    "args": ((list, dict), "the pool's extra engine flags, over m3_extra_args"),
    "env": (dict, "the pool's extra engine env, over m3_extra_env"),
    "unset": (list, "engine flags or env names the pool drops"),
    "readiness_timeout_s": (int, "the pool's readiness timeout, seconds"),
}
# m3_disagg's own keys besides the pools: the mocker's transfer simulation (dynamo/mocker/args.py)
TOP_KEYS: dict[str, tuple[Any, str]] = {
    "kv_transfer_bandwidth": ((int, float), "mocker: --kv-transfer-bandwidth, GB/s (default 50: one 400 Gb/s NIC)"),
    "kv_bytes_per_token": (int, "mocker: --kv-bytes-per-token (default catalog.yaml model.kv_bytes_per_token)"),
    "bootstrap_port": (int, "a prefill worker's bootstrap port (SGLang --disaggregation-bootstrap-port, the mocker's "
                            "--bootstrap-ports; +1 per worker on a host); default 8998, SGLang's"),
    "nixl_side_channel_port": (int, "vLLM: VLLM_NIXL_SIDE_CHANNEL_PORT (+ TP size per worker on a host: one port "
                                    "per rank); default 5600, vLLM's"),
}
PORTS = {"bootstrap_port": 8998, "nixl_side_channel_port": 5600}
DEFAULT_BANDWIDTH_GBPS = 50  # one 400 Gb/s NDR/XDR port: the per-GPU NIC of H200 / GB200 hosts
# Dynamo's recipe note: encoder disaggregation "is not available across Dynamo backends for MiniMax M3"
REFUSED = {"encode": "encoder disaggregation is not supported for MiniMax-M3 in any Dynamo framework (Dynamo "
                     "recipes/minimax-m3/README.md: \"Encoder disaggregation is not supported in any framework\")"}
LAYER, SOURCE = "cluster:m3_disagg", "group_data"


def enabled(s: Mapping[str, Any]) -> bool:
    return bool(s.get("m3_disagg"))


def pool_settings(s: Mapping[str, Any], pool: str) -> dict[str, Any]:
    return dict((s.get("m3_disagg") or {}).get(pool) or {})


def shape_problem(value: Mapping[str, Any]) -> str:
    """m3_disagg's shape ('' when fine): known keys of the right types, both pools (the input check)."""
    for k in value:
        if k in REFUSED:
            return f"{k!r}: {REFUSED[k]}. Fix: remove it"
        if k not in POOLS and k not in TOP_KEYS:
            return (f"unknown key {k!r}. Fix: one of {', '.join(map(repr, POOLS + tuple(TOP_KEYS)))}")
    for k, (t, _) in TOP_KEYS.items():
        if k in value and (not isinstance(value[k], t) or isinstance(value[k], bool) or value[k] <= 0):
            return f"{k!r}: {value[k]!r} is not a positive number"
        if k in PORTS and k in value and not 1024 <= value[k] <= 65535:
            return f"{k!r}: {value[k]} is not a TCP port in 1024-65535"
    if value and any(p not in value for p in POOLS):
        return "name both pools, 'prefill' and 'decode' (e.g. {'prefill': {'workers': 1}, 'decode': {'workers': 1}})"
    for pool in POOLS if value else ():
        cfg = value[pool]
        if not isinstance(cfg, dict):
            return f"{pool!r}: expected a dict of {', '.join(POOL_KEYS)}, got {type(cfg).__name__}"
        for k, v in cfg.items():
            if k not in POOL_KEYS:
                return f"{pool}.{k}: unknown key. Fix: one of {', '.join(POOL_KEYS)}"
            if not isinstance(v, POOL_KEYS[k][0]) or isinstance(v, bool):
                return f"{pool}.{k}: {v!r} is not a {POOL_KEYS[k][0]}"
        if int(cfg.get("workers", 1)) < 1 or int(cfg.get("readiness_timeout_s", 1)) < 1:
            return f"{pool}: workers and readiness_timeout_s are at least 1"
        if "parallel" in cfg and not settings.PARALLEL_RE.match(cfg["parallel"]):
            return f"{pool}.parallel: {cfg['parallel']!r} is not tp<N>, tp<N>-ep or dp<N>-ep"
    return ""


def parallel(s: Mapping[str, Any], pool: str) -> tuple[str, int, bool]:
    return settings.parse_parallel(pool_settings(s, pool).get("parallel") or s["m3_parallel"])


def _need(s: Mapping[str, Any], pool: str, gpus: int) -> tuple[int, layout.Layout]:
    """(hosts the pool needs, its layout)."""
    lay = layout.Layout(parallel(s, pool)[1], gpus)
    workers = int(pool_settings(s, pool).get("workers", 1))
    return -(-workers // lay.per_host) * lay.span, lay


def assign(s: Mapping[str, Any], workers: Sequence[Any]) -> dict[str, list[Any]]:
    """The hosts of each pool: a host's m3_disagg_role first, then the rest in rank order, prefill first."""
    out: dict[str, list[Any]] = {p: [h for h in workers if settings.get(h.data, "m3_disagg_role") == p]
                                 for p in POOLS}
    free = [h for h in workers if not settings.get(h.data, "m3_disagg_role")]
    for pool in POOLS:
        need = _need(s, pool, layout.gpus_per_host(workers[0].data))[0] if workers else 0
        take = max(0, need - len(out[pool]))
        out[pool], free = out[pool] + free[:take], free[take:]
    return out


def problems(s: Mapping[str, Any], workers: Sequence[Any], n_control: int, features: set[str]) -> list[str]:
    """What cannot be disaggregated (validate.disagg_settings): the engine, the serving mode, the pools' fit."""
    out: list[str] = []
    if not enabled(s):
        if any(settings.get(h.data, "m3_disagg_role") for h in workers):
            out.append("key m3_disagg_role: set on a host but m3_disagg is not set (aggregated serving has no pools). "
                       "Fix: set m3_disagg, or remove m3_disagg_role")
        return out
    engine = str(s["m3_engine"])
    rules = catalog.engines().get(engine) or {}
    if rules.get("disagg_refused"):
        out.append(f"key m3_disagg: {engine} cannot serve MiniMax-M3 disaggregated: {rules['disagg_refused']}. "
                   "Fix: m3_engine = 'vllm' or 'sglang', or remove m3_disagg")
    if s["m3_serving"] != "dynamo" or not n_control:
        out.append("key m3_disagg: prefill and decode pools are Dynamo's (its KV router pairs them). Fix: m3_serving ="
                   " 'dynamo' with a control group, or remove m3_disagg")
    out += [f"key m3_disagg: with feature '{f}' ({why}). Fix: drop the feature, or remove m3_disagg"
            for f, why in (rules.get("disagg_conflicts") or {}).items() if f in features]
    out += _fit_problems(s, workers)
    return out


def _fit_problems(s: Mapping[str, Any], workers: Sequence[Any]) -> list[str]:
    if not workers:
        return []
    gpus = layout.gpus_per_host(workers[0].data)
    pools, out = assign(s, workers), []
    for pool in POOLS:
        need, lay = _need(s, pool, gpus)
        n = int(pool_settings(s, pool).get("workers", 1))
        if not lay.fits:
            out.append(f"key m3_disagg: the {pool} pool's {parallel_name(s, pool)} does not lay out on {gpus}-GPU "
                       "hosts (a size that divides a host's GPUs, or a multiple of them). Fix: another parallel")
        elif n % lay.per_host:
            out.append(f"key m3_disagg: {n} {pool} workers do not fill whole hosts ({lay.per_host} per {gpus}-GPU "
                       f"host). Fix: a multiple of {lay.per_host} workers")
        elif len(pools[pool]) != need:
            named = [h.name for h in pools[pool] if settings.get(h.data, "m3_disagg_role") == pool]
            out.append(f"key m3_disagg: the {pool} pool needs {plural(need, 'host')} ({n} x {parallel_name(s, pool)} "
                       f"on {gpus}-GPU hosts) but has {len(pools[pool])}"
                       + (f" ({', '.join(named)} set m3_disagg_role = '{pool}')" if named else "")
                       + ". Fix: change the pool's workers, or add/move worker hosts")
        out += _memory_problem(s, workers[0].data, pool, lay.size)
    left = [h.name for h in workers if not any(h in pools[p] for p in POOLS)]
    if left and not out:
        out.append(f"group workers: {', '.join(left)} are in no pool (m3_disagg's pools take "
                   f"{sum(len(pools[p]) for p in POOLS)} hosts). Fix: more workers in a pool, or fewer worker hosts")
    return out


def _memory_problem(s: Mapping[str, Any], data: Mapping[str, Any], pool: str, size: int) -> list[str]:
    """A pool's worker must hold the variant's weights (catalog.yaml vram_minimum_gb), as validate.worker_layout
    checks for m3_parallel."""
    info = catalog.platform(str(settings.get(data, "m3_platform")))
    if info.get("vendor") not in ("nvidia", "amd") or (catalog.engines().get(str(s["m3_engine"])) or {}).get(
            "simulated"):
        return []
    per_gpu = int(data.get("m3_gpu_memory_gb") or info["gpu_memory_gb"])
    need = int(catalog.catalog()["variants"][s["m3_variant"]]["vram_minimum_gb"])
    if per_gpu * size >= need:
        return []
    return [f"key m3_disagg: the {pool} pool's {parallel_name(s, pool)} worker has {size} x {per_gpu} GB of GPU "
            f"memory, below the {s['m3_variant']} weights' {need} GB. Fix: a larger parallel for the pool, or a "
            "smaller variant"]


def parallel_name(s: Mapping[str, Any], pool: str) -> str:
    return str(pool_settings(s, pool).get("parallel") or s["m3_parallel"])


def pools(s: Mapping[str, Any], workers: Sequence[Any]) -> list[tuple[str, tuple[str, int, bool], list[Any]]]:
    """Each pool, prefill first: its name, its parallelism (mode, size, ep) and its hosts (core.build lays each
    pool's workers over its hosts; worker indices run on across the pools)."""
    hosts = assign(s, workers)
    return [(pool, parallel(s, pool), hosts[pool]) for pool in POOLS]


def ctx(s: Mapping[str, Any], pool: str, slot: int, size: int) -> dict[str, Any]:
    """What the disagg layers read (data/layers/65-disagg.yaml): the pool, its ports (+ slot per worker on a host;
    vLLM's side channel takes one port per TP rank: + slot x size), the mocker's transfer model."""
    cfg = s.get("m3_disagg") or {}
    return {"disagg": pool or "agg", **({"parallel": parallel_name(s, pool)} if pool else {}),
            "bootstrap_port": int(cfg.get("bootstrap_port", PORTS["bootstrap_port"])) + slot,
            "nixl_side_channel_port": int(cfg.get("nixl_side_channel_port", PORTS["nixl_side_channel_port"]))
            + slot * size,
            "kv_transfer_bandwidth": cfg.get("kv_transfer_bandwidth", DEFAULT_BANDWIDTH_GBPS),
            "kv_bytes_per_token": cfg.get("kv_bytes_per_token", catalog.catalog()["model"]["kv_bytes_per_token"])}


def overrides(r: Any, s: Mapping[str, Any], pool: str, parse_args: Callable, source: str = SOURCE) -> None:
    """The pool's own flags and env, over the cluster's (provenance cluster:m3_disagg.<pool>, from `source`: the
    file or `--data` that set m3_disagg)."""
    if not pool:
        return
    cfg, layer, src = pool_settings(s, pool), f"{LAYER}.{pool}", source
    for key in cfg.get("unset") or ():
        r.unset(str(key), layer, src)
    for flag, value in parse_args(cfg.get("args") or []):
        r.set_arg(flag, value, layer, src)
    for k, v in (cfg.get("env") or {}).items():
        r.set_env(k, str(v), layer, src)
    if cfg.get("readiness_timeout_s"):
        r.readiness_timeout_s = int(cfg["readiness_timeout_s"])
        r.provenance["readiness_timeout_s"] = (r.readiness_timeout_s, layer, src)


def ports(args: Mapping[str, Any], env: Mapping[str, str], address: str, rules: Mapping[str, Any],
          size: int = 1) -> list[Port]:
    """The KV-transfer ports a disaggregated worker listens on, from what its layers set (the resolved recipe's
    flags and env, before any argv is made): the bootstrap port (SGLang's --disaggregation-bootstrap-port, the
    mocker's --bootstrap-ports) and vLLM's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT and the next size - 1:
    one per TP rank, `Port.span`). An engine whose bootstrap server binds every interface, with no flag to choose
    one, says so in engines.yaml (`disagg_bootstrap_binds_all`): the plan says it too."""
    out = []
    bind = "0.0.0.0" if rules.get("disagg_bootstrap_binds_all") else address
    for flag in ("--disaggregation-bootstrap-port", "--bootstrap-ports"):
        if args.get(flag) is not None:
            out.append(Port("bootstrap", int(args[flag]), bind, key="m3_disagg.bootstrap_port"))
    if env.get("VLLM_NIXL_SIDE_CHANNEL_PORT"):
        out.append(Port("nixl", int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]), address, span=size,
                        key="m3_disagg.nixl_side_channel_port"))
    return out


def uses_fabric(svc: Any) -> bool:
    """A worker that moves KV over the network (NIXL/UCX): it gets its host's RDMA env from facts."""
    return any(p.name in ("nixl", "bootstrap") for p in svc.ports)


def pool_of(svc: Any) -> str:
    """A worker's pool, as its builder decided it (Service.pool; '' when aggregated)."""
    return svc.pool
