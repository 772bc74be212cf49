"""Every rule a cluster must satisfy, checked before any host is touched: a registry of small rules.

Each problem names where (host, key or file), what is wrong, and the fix. All problems are reported at once:
`check_inventory` runs the inventory rules (RULES, then PLATFORM_RULES once the platform, variant, engine and
parallel mode are known) on the raw m3_* data, so the plan can be built; `check_plan` looks at the built plan.
"""
from __future__ import annotations

import difflib
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from m3deploy.core import catalog, fanout, inputs, layout, mpi, ports, recipes
from m3deploy.core.errors import plural
from m3deploy.core.inventory import InvHost
from m3deploy.core.settings import CLUSTER_KEYS, PARALLEL_RE, cluster_settings, effective_features, get, parse_parallel


def _v(h: InvHost, key: str):
    return get(h.data, key)  # typed: m3deploy.core.inputs checked every value first


def _list(values) -> str:
    return ", ".join(str(v) for v in values)


@dataclass
class Cluster:
    """What the inventory rules read, computed once from the raw m3_* data (no messages here)."""

    hosts: list[InvHost]
    cat: dict = field(default_factory=catalog.catalog)

    def __post_init__(self):
        self.platforms, self.variants = self.cat["platforms"], self.cat["variants"]
        self.workers = [h for h in self.hosts if "workers" in h.groups]
        self.control = [h for h in self.hosts if "control" in h.groups]
        self.ref = self.workers[0]
        ref = self.ref
        self.s = s = cluster_settings(ref.data, [h.data for h in self.workers + self.control])  # as build reads them
        self.variant, self.engine = str(s["m3_variant"]), str(s["m3_engine"])
        self.serving, self.state = str(s["m3_serving"]), str(s["m3_state"])
        self.raw_features = s["m3_features"] or []
        self.features = set(effective_features(self.raw_features))
        self.mode = str(s["m3_parallel"])
        self.size = parse_parallel(self.mode)[1] if PARALLEL_RE.match(self.mode) else 0
        self.mml = s["m3_max_model_len"]
        self.model = catalog.model_constants(self.engine)  # catalog.yaml `model:`: block size, context windows
        self.rules = catalog.engines().get(self.engine) or {}  # engines.yaml: how the engine runs
        self.plat_of = {h.name: h.data["m3_platform"] for h in self.workers
                        if h.data.get("m3_platform") in self.platforms}
        # the platform rules need a known platform (on every worker), variant, engine and parallel mode
        self.known = (ref.name in self.plat_of and self.variant in self.variants and self.engine in self.cat["engines"]
                      and bool(PARALLEL_RE.match(self.mode)) and len(self.plat_of) == len(self.workers))
        if self.known:
            self.platform = self.plat_of[ref.name]
            self.info, self.vinfo = self.platforms[self.platform], self.variants[self.variant]


Add = Callable[[str], None]
RULES: list[Callable[[Cluster, Add], None]] = []  # any inventory
PLATFORM_RULES: list[Callable[[Cluster, Add], None]] = []  # once Cluster.known


def rule(registry):
    def register(fn):
        registry.append(fn)
        return fn
    return register


def check_inventory(hosts: list[InvHost]) -> list[str]:
    """Every rule's problems, in rule order (the registries above)."""
    if not hosts:
        return ["the inventory has no hosts. Fix: list hosts in the `control` and `workers` groups"]
    if not any("workers" in h.groups for h in hosts):
        return ["the inventory has no `workers` group (GPU hosts). Fix: define `workers = [...]` in the inventory file"]
    problems = inputs.check_hosts(hosts)  # the schema and the input contract, before any rule reads a value
    if problems:
        return problems
    c = Cluster(hosts)
    for fn in RULES + (PLATFORM_RULES if c.known else []):
        fn(c, problems.append)
    return problems


@rule(RULES)
def cluster_keys_agree(c: Cluster, add: Add) -> None:
    """A cluster key (settings.CLUSTER_KEYS) is one value: every worker runs with the same one (defaults
    included), and the hosts that set it, control hosts included, set the same one; a key only the control group
    sets is the cluster's (settings.cluster_settings)."""
    for key in CLUSTER_KEYS:
        seen = _by_value(c.workers, key)
        where = "workers"
        if len(seen) < 2:
            seen = _by_value([h for h in c.hosts if h.data.get(key) is not None], key)
            where = "hosts"
        if len(seen) > 1:
            detail = "; ".join(f"{v} on {_list(names)}" + (f" ({_list(sorted(files))})" if files else "")
                               for v, (names, files) in seen.items())
            add(f"key {key} differs between {where} ({detail}). Fix: set it once in the cluster's group_data file "
                "(it is one value for the whole cluster)")


def _by_value(hosts: list[InvHost], key: str) -> dict[str, tuple[list[str], set[str]]]:
    """{repr(value): ([host names], {files it was set in})} of `key` over `hosts`, in their order."""
    seen: dict[str, tuple[list[str], set[str]]] = {}
    for h in hosts:
        names, files = seen.setdefault(repr(_v(h, key)), ([], set()))
        names.append(h.name)
        if h.sources.get(key):
            files.add(h.sources[key])
    return seen


@rule(RULES)
def known_names(c: Cluster, add: Add) -> None:
    cat = c.cat
    if c.variant not in c.variants:
        add(f"key m3_variant: unknown variant {c.variant!r}. Fix: use one of {_list(c.variants)}")
    if c.engine not in cat["engines"]:
        add(f"key m3_engine: unknown engine {c.engine!r}. Fix: use one of {_list(cat['engines'])}")
    if c.serving not in cat["servings"]:
        add(f"key m3_serving: unknown serving mode {c.serving!r}. Fix: use one of {_list(cat['servings'])}")
    if c.state not in ("present", "absent"):
        add(f"key m3_state: {c.state!r} is neither 'present' nor 'absent'")
    pull = str(c.s["m3_image_pull"])
    if pull not in ("missing", "always"):
        add(f"key m3_image_pull: {pull!r} is neither 'missing' nor 'always'. Fix: m3_image_pull = 'always' to pull "
            "tags on every deploy")


@rule(RULES)
def features_known(c: Cluster, add: Add) -> None:
    known = set(c.cat["features"])
    for f in c.raw_features:
        base = f[3:] if str(f).startswith("no-") else f
        if base not in known:
            add(f"key m3_features: unknown feature {f!r}. Fix: use any of {_list(sorted(known))} "
                f"(prefix `no-` to drop a default one)")
    if {"text-only", "encoder-parallel"} <= c.features:
        add("key m3_features: 'text-only' and 'encoder-parallel' are mutually exclusive (text-only skips the vision "
            "encoder that encoder-parallel parallelizes). Fix: keep one")
    if {"fp8-per-channel", "encoder-parallel"} <= c.features:
        add("key m3_features: 'fp8-per-channel' and 'encoder-parallel' do not combine: the seed's PTPC command "
            "(TP8 + --quantization fp8_per_channel) serves without the vision-encoder flags, so fp8-per-channel "
            "drops them. Fix: keep one")
    if {"eagle3", "eagle3-gqa"} <= c.features:
        add("key m3_features: pick one EAGLE3 draft head, 'eagle3' (MHA) or 'eagle3-gqa'")


@rule(RULES)
def parallel_mode(c: Cluster, add: Add) -> None:
    if not PARALLEL_RE.match(c.mode):
        add(f"key m3_parallel: {c.mode!r} is not a parallel mode. Fix: use tp<N>, tp<N>-ep or dp<N>-ep "
            f"(e.g. {_list(c.cat['parallel_modes'])})")
    elif c.size < 1:
        add(f"key m3_parallel: {c.mode!r} needs a size of at least 1")


@rule(RULES)
def max_model_len(c: Cluster, add: Add) -> None:
    mml = c.mml
    if mml is not None:
        if not isinstance(mml, int) or isinstance(mml, bool) or mml <= 0:
            add(f"key m3_max_model_len: {mml!r} is not a positive integer (tokens)")
        elif mml > c.model["max_context"]:
            add(f"key m3_max_model_len: {mml} is above MiniMax-M3's 1M-token window ({c.model['max_context']})")
        elif (cpu := catalog.cpu_build(c.engine, c.platform if c.known else None)) and mml > int(cpu["max_context"]):
            add(f"key m3_max_model_len: {mml} is above the {cpu['max_context']}-token window of {cpu['model']}, the "
                f"model {c.engine}'s CPU build serves on platform {c.platform} (engines.yaml {c.engine} cpu: "
                f"max_context); vLLM would refuse it at every start. Fix: m3_max_model_len <= {cpu['max_context']}, "
                "or unset")


@rule(RULES)
def edge_settings(c: Cluster, add: Add) -> None:
    """m3_edge and its keys (m3deploy.core.edge.problems)."""
    from m3deploy.core import edge

    for p in edge.problems({k: _v(c.ref, k) for k in ("m3_edge", "m3_serving", "m3_frontend_port", "m3_edge_port",
                            "m3_edge_frontends", "m3_tls_cert_file", "m3_tls_key_file", "m3_tls_ca_file")},
                           len(c.control)):
        add(p)
    from m3deploy.core import vip

    for p in vip.problems({k: _v(c.ref, k) for k in ("m3_vip", "m3_vip_router_id", "m3_edge", "m3_serving")},
                          {h.name: inputs.address_of(h) for h in c.control},
                          {h.name: inputs.address_of(h) for h in c.hosts}):
        add(p)
    from m3deploy.core import internal_tls

    for p in internal_tls.problems({k: _v(c.ref, k) for k in ("m3_internal_tls", "m3_serving")}, len(c.control)):
        add(p)
    for p in internal_tls.lifetime_problems(c.s):
        add(p)


@rule(RULES)
def disagg_settings(c: Cluster, add: Add) -> None:
    """m3_disagg: what cannot be disaggregated, and whether the pools fit the hosts (m3deploy.core.disagg)."""
    from m3deploy.core import disagg

    for p in disagg.problems(c.s, c.workers, len(c.control), c.features):
        add(p)


@rule(RULES)
def planner_settings(c: Cluster, add: Add) -> None:
    """m3_planner and the standby group (m3deploy.core.planner)."""
    from m3deploy.core import disagg, planner

    groups = {g: [h.name for h in c.hosts if g in h.groups] for g in ("control", "workers", planner.STANDBY_GROUP)}
    for p in planner.problems(c.s, groups, disagg.enabled(c.s)):
        add(p)


@rule(RULES)
def rollout(c: Cluster, add: Add) -> None:
    """m3_rollout / m3_rollout_max_unavailable (roles/rolling.py, docs/OPERATIONS.md)."""
    mode = c.s["m3_rollout"]
    if mode not in ("rolling", "all-at-once"):
        add(f"key m3_rollout: {mode!r} is not a rollout strategy. Fix: use 'rolling' (one engine instance at a "
            "time, no failed requests) or 'all-at-once' (every changed worker together)")
    n = c.s["m3_rollout_max_unavailable"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        add(f"key m3_rollout_max_unavailable: {n!r} must be a whole number >= 1 (engine instances drained and "
            "restarted together). Fix: m3_rollout_max_unavailable = 1")


@rule(RULES)
def weights_source(c: Cluster, add: Add) -> None:
    """m3_weights_source = mirror:<host> names an inventory host; mock repos come from the controller."""
    kind, mirror = fanout.parse_source(c.s["m3_weights_source"])  # format checked by inputs
    names = [h.name for h in c.hosts]
    if kind == "mirror" and mirror not in names:
        near = difflib.get_close_matches(mirror, names, n=1)
        add(f"key m3_weights_source: mirror:{mirror} names no host of the inventory"
            + (f" (did you mean mirror:{near[0]}?)" if near else "")
            + f". Fix: m3_weights_source = 'mirror:<host>' with one of {_list(names[:8])}"
            + (" ..." if len(names) > 8 else "") + ", or 'controller'")
    elif kind == "mirror" and mirror not in [h.name for h in c.workers]:
        add(f"key m3_weights_source: the mirror {mirror} is not in the `workers` group: only GPU hosts have an HF "
            f"cache to download into and serve from. Fix: name a host of the workers group, or 'controller'")
    if c.s["m3_mock_repo_mb"] and kind != "controller":
        add(f"key m3_mock_repo_mb: mock repos are built on the controller, but m3_weights_source is "
            f"{c.s['m3_weights_source']!r}. Fix: also set m3_weights_source = 'controller'")
    if c.rules.get("simulated") and c.s["m3_runtime"] == "docker" and not (
            c.s["m3_mock_repo_mb"] and kind == "controller"):
        add("key m3_runtime: the docker testbed's workers (HF_HUB_OFFLINE=1) load the staged mock repos, the target "
            "and a mock EAGLE3 draft, from the mounted HF cache, so they must be built and staged. Fix: also pass "
            "--data m3_weights_source=controller --data m3_mock_repo_mb=8 (docs/TESTBED.md)")


@rule(RULES)
def extra_args_parse(c: Cluster, add: Add) -> None:
    try:
        recipes.parse_arg_list(c.s["m3_extra_args"] or [])
    except Exception as e:  # M3Error with the offending token
        add(f"key {e}")


@rule(RULES)
def block_size_kept(c: Cluster, add: Add) -> None:
    """The seed: "--block-size 128 is mandatory"; another size in m3_extra_args is check_plan's (on the argv)."""
    for k in c.s["m3_unset_args"] or ():
        if str(k).replace("_", "-") == "--block-size":
            add(f"key m3_unset_args: {k!r} drops --block-size {c.model['block_size']}, which MiniMax-M3 needs on every "
                "platform (MSA "
                f"sparse block; the engine's default 16 misaligns sparse attention). Fix: remove {k!r} from "
                "m3_unset_args")


@rule(RULES)
def host_platforms(c: Cluster, add: Add) -> None:
    platforms = c.platforms
    for h in c.workers:
        p = h.data.get("m3_platform")
        if not p:
            add(f"host {h.name}: key m3_platform is not set. Fix: set it in group_data (one of {_list(platforms)})")
            continue
        if p not in platforms:
            add(f"host {h.name}: key m3_platform: unknown platform {p!r}. Fix: use one of {_list(platforms)}")
            continue


@rule(PLATFORM_RULES)
def variant_fits_platform(c: Cluster, add: Add) -> None:
    """On every worker's platform, not only the first's."""
    variant, vinfo = c.variant, c.vinfo
    by_platform = defaultdict(list)
    for name, p in c.plat_of.items():
        by_platform[p].append(name)
    for platform, names in by_platform.items():
        if "generations" in vinfo and c.platforms[platform]["generation"] not in vinfo["generations"]:
            ok = [p for p, i in c.platforms.items() if i["generation"] in vinfo["generations"]]
            add(f"key m3_variant: {variant} needs {'/'.join(vinfo['generations'])} GPUs but m3_platform is "
                f"{platform} on {_list(names)}. Fix: use {variant} on {_list(ok)}, or pick another variant "
                "(mxfp8, bf16)")
        if "platforms" in vinfo and platform not in vinfo["platforms"]:
            add(f"key m3_variant: {variant} runs only on {_list(vinfo['platforms'])}, not on {platform} "
                f"({_list(names)}). Fix: use mxfp8 or bf16 on {platform}")


@rule(PLATFORM_RULES)
def engine_fits(c: Cluster, add: Add) -> None:
    engine, serving, platform, features, info = c.engine, c.serving, c.platform, c.features, c.info
    simulated = sorted(e for e, r in catalog.engines().items() if r.get("simulated"))
    cpu = sorted(e for e, r in catalog.engines().items() if r.get("cpu"))
    if info["vendor"] == "none" and not c.rules.get("simulated") and not c.rules.get("cpu"):
        add(f"key m3_engine: the {platform} platform (testbed, no GPU) runs only the {_list(simulated)} engine, or "
            f"the CPU build of {_list(cpu)}, not {engine}. Fix: m3_engine = {simulated[0]!r}")
    launch = c.rules.get("launch") or {}
    if serving in c.cat["servings"] and serving not in launch:  # an unknown serving mode is known_names's
        add(f"key m3_serving: the {engine} engine has no {serving} launch line (engines.yaml `launch`); it needs "
            + " or ".join(f"m3_serving = {m!r}" for m in launch))
    # Dynamo's MiniMax-M3 recipe (ai-dynamo/dynamo recipes/minimax-m3/README.md): TensorRT-LLM aggregated, BF16,
    # text only; the vendor blog (seed 002) also serves it text-only
    if engine == "trtllm" and "text-only" not in features:
        add("key m3_features: TensorRT-LLM serves MiniMax-M3 text-only (no image input: Dynamo's MiniMax-M3 recipe "
            "and the vendor blog). Fix: add 'text-only' to m3_features")
    if engine == "trtllm" and c.variant != "bf16":
        add(f"key m3_variant: TensorRT-LLM runs MiniMax-M3 from the BF16 checkpoint only (Dynamo's MiniMax-M3 "
            f"recipe; no {c.variant} TensorRT-LLM recipe exists), not {c.variant}. Fix: m3_variant = 'bf16', or "
            "m3_engine = 'vllm'")
    if engine == "sglang" and serving == "standalone" and info["vendor"] == "amd":
        add("key m3_engine: the SGLang launch line in the recipe is NVIDIA's. Fix: use vllm on AMD")
    if engine == "trtllm" and info["vendor"] != "nvidia":
        add(f"key m3_engine: TensorRT-LLM runs on NVIDIA GPUs, not on {platform}. Fix: use vllm")


@rule(RULES)
def features_have_an_effect(c: Cluster, add: Add) -> None:
    """A feature the user asks for is what some recipe layer does for the chosen engine (the layers' own `when`:
    core/data/layers/*.yaml); a feature no layer applies to on that engine would be dropped silently."""
    if c.engine not in c.cat["engines"]:
        return  # known_names says so
    for f in dict.fromkeys(str(x) for x in c.raw_features if not str(x).startswith("no-")):
        feature_layers = [layer for layer in recipes.layers() if f in layer.when.get("features", ())]
        engines = {layer.when.get("engine") for layer in feature_layers}
        if not feature_layers or None in engines or c.engine in engines:
            continue  # unknown features are features_known's; a layer for any engine, or this one, applies
        on = sorted(str(e) for e in engines)
        files = sorted({layer.source.rsplit("/", 1)[-1] for layer in feature_layers})
        add(f"key m3_features: {f!r} has no effect with m3_engine = {c.engine!r}: the recipe layers that "
            f"implement it ({_list(files)}) apply to {_list(on)} only, so the plan would carry none of its flags. "
            f"Fix: drop {f!r} from m3_features, or use m3_engine = {on[0]!r}")


@rule(RULES)
def api_key_carried(c: Cluster, add: Add) -> None:
    """m3_api_key_file only where the server itself checks the key (docs/CONTRACTS.md "API keys"): a key that
    nothing enforces would look like protection and be none."""
    if not c.s["m3_api_key_file"]:
        return
    fix = ("Fix: remove m3_api_key_file and put an authenticating reverse proxy (TLS + Bearer key) in front of "
           "the endpoint (m3_edge = true: HAProxy on the control hosts checks it), or serve with m3_engine = 'vllm', "
           "m3_serving = 'standalone' (vLLM checks the key itself)")
    if c.serving == "dynamo" and _v(c.ref, "m3_edge"):
        return  # the edge checks the key (m3deploy.core.edge)
    if c.serving == "dynamo":
        add("key m3_api_key_file: the Dynamo 1.6.1 frontend has no API-key option (no flag or env in "
            "dynamo.frontend or its HTTP service; its client auth is mutual TLS only), so nothing would check the "
            f"key. {fix}")
        return
    rules = catalog.engines().get(c.engine) or {}
    if not rules.get("api_key_env"):
        why = rules.get("api_key_refused") or f"the {c.engine} engine reads no API key from its environment"
        add(f"key m3_api_key_file: {why}. {fix}")


@rule(PLATFORM_RULES)
def scoped_features(c: Cluster, add: Add) -> None:
    """Features a recipe layer scopes (`scope:`): valid only where that layer's own `when` matches."""
    ctx = {"platform": c.platform, "vendor": c.info["vendor"], "generation": c.info["generation"],
           "variant": c.variant, "parallel": c.mode}
    for layer in recipes.layers():
        when = {k: v for k, v in layer.when.items() if k not in ("features", "engine")}
        for feature in layer.when.get("features", ()) if layer.scope else ():
            if feature in c.features and not recipes.matches(when, ctx):
                add(f"key m3_features: {feature!r} applies to {layer.scope} only (this cluster: {c.platform}, "
                    f"{c.variant}, {c.mode}). Fix: drop it")


@rule(PLATFORM_RULES)
def amd_context_and_bf16(c: Cluster, add: Add) -> None:
    """The seed's AMD notes: native context 512K (YaRN past it: long-context-1m); BF16 needs TP=8."""
    if c.info["vendor"] != "amd" or c.rules.get("simulated"):
        return
    native = c.model["native_context"]  # the seed: "AMD ROCm notes: Native context is 512K" (YaRN past it)
    if isinstance(c.mml, int) and c.mml > native and "long-context-1m" not in c.features:
        add(f"key m3_max_model_len: {c.mml} is past AMD's native context ({native}, 512K) on "
            f"{c.platform}; going past it needs the YaRN rope_scaling override. Fix: add 'long-context-1m' to "
            f"m3_features, or m3_max_model_len <= {native}")
    if c.variant == "bf16" and c.size and c.size < 8:
        add(f"key m3_parallel: BF16 needs TP=8 on AMD (the seed), not {c.mode} on {c.platform}. Fix: "
            "m3_parallel = 'tp8' (or 'tp8-ep'/'dp8-ep'), or the mxfp8 variant from TP=4")


@rule(PLATFORM_RULES)
def tuned_recipe_needs_max_model_len(c: Cluster, add: Add) -> None:
    if c.platform == "mi300x" and c.variant == "mxfp8" and c.engine == "vllm" and c.mml is None:
        add("key m3_max_model_len: the MI300X MXFP8 tuned recipe passes --max-model-len \"$MAX_MODEL_LEN\". "
            "Fix: set m3_max_model_len (e.g. 131072)")


@rule(PLATFORM_RULES)
def worker_layout(c: Cluster, add: Add) -> None:
    """Tensor/data-parallel size vs GPUs per host x hosts (core.layout), and the weights vs GPU memory."""
    size, mode, platform, workers, engine = c.size, c.mode, c.platform, c.workers, c.engine
    if not size:
        return
    G = {h.name: layout.gpus_per_host(h.data) for h in workers}
    g = G[c.ref.name]
    lay = layout.Layout(size, g)
    if len(set(G.values())) > 1:
        add("key m3_gpus_per_host: workers have different GPU counts ("
            + "; ".join(f"{n}: {k}" for n, k in G.items()) + "). Fix: one GPU count per cluster")
    elif not lay.multi_host:
        if not lay.fits:
            add(f"key m3_parallel: {mode} does not divide a host's {g} GPUs ({platform}) into whole workers. "
                f"Fix: use a size that divides {g}")
    elif not lay.fits:
        add(f"key m3_parallel: {mode} is not a multiple of {g} GPUs per {platform} host. Fix: use "
            f"{g * max(1, size // g)} or {g * (size // g + 1)}")
    elif len(workers) % lay.span:
        span = lay.span
        n = len(workers)
        add(f"group workers: {plural(n, 'host')} {'does' if n == 1 else 'do'} not divide into whole {mode} workers "
            f"of {plural(span, 'host')} ({plural(g, 'GPU')} each). Fix: use a multiple of {span} hosts, or a smaller "
            "m3_parallel")
    else:
        for i, grp in enumerate(lay.groups(workers)):
            kinds = {c.plat_of[h.name] for h in grp}
            if len(kinds) > 1:
                add(f"worker {i} (hosts {_list(h.name for h in grp)}) mixes platforms "
                    f"{_list(sorted(kinds))}. Fix: a worker spans hosts of one platform")
    if c.info["vendor"] == "none" and size != 1:
        add(f"key m3_parallel: the sim platform has one simulated device per host; use 'tp1' (got {mode})")
    rules = catalog.engines().get(engine) or {}
    if size > g and not rules.get("multi_host") and not mpi.spec(rules, c.serving):
        add(f"key m3_parallel: a {engine} worker over several hosts ({mode} over {g}-GPU hosts) under "
            f"m3_serving = '{c.serving}' has no multi-host launch (m3deploy/core/data/engines.yaml: no multi_host "
            f"flags, no mpi_world for {c.serving}). Fix: a {mode} that fits one host"
            + (", or m3_serving = 'dynamo' (one MPI world)" if rules.get("mpi_world") else ""))
    # weights must fit in the worker's GPU memory
    if not c.rules.get("simulated") and c.info["vendor"] != "none":
        per_gpu = int(_v(c.ref, "m3_gpu_memory_gb") or c.info["gpu_memory_gb"])
        mem = per_gpu * size
        need_gb = c.vinfo["vram_minimum_gb"]
        if "fp8-per-channel" in c.features:
            need_gb = need_gb // 2
        if mem < need_gb:
            add(f"key m3_parallel: {c.variant} weights need >= {need_gb} GB of GPU memory but a {mode} worker on "
                f"{platform} has {size} x {per_gpu} GB = {mem} GB. Fix: a larger tensor-parallel "
                f"size, more hosts per worker, a smaller variant (mxfp8 {c.variants['mxfp8']['vram_minimum_gb']} GB), "
                "or "
                f"m3_gpu_memory_gb (per GPU, {per_gpu} GB now) if these GPUs have more memory")


@rule(PLATFORM_RULES)
def dynamo_needs_control(c: Cluster, add: Add) -> None:
    if c.serving == "dynamo" and not c.control:
        add("group control: a Dynamo deploy needs a `control` host for etcd, NATS and the frontend. Fix: add "
            "`control = [...]` to the inventory")


@rule(PLATFORM_RULES)
def control_count(c: Cluster, add: Add) -> None:
    """1 control host (etcd, NATS, frontend on it) or 3 (a 3-member etcd and a 3-node NATS cluster, one member
    each): etcd needs a majority of its members, so an even count tolerates no more failures than one fewer."""
    n = len(c.control)
    if c.serving != "dynamo" or n in (0, 1, 3):
        return
    names = ", ".join(h.name for h in c.control)
    if n % 2 == 0:
        add(f"group control: {n} hosts ({names}). etcd needs a majority of its members up, so a {n}-member etcd "
            f"survives no more host failures than a {n - 1}-member one"
            + (" (none: an etcd of 2 has no more fault tolerance than 1 and twice the chance of losing a member)"
               if n == 2 else "") +
            ". Fix: put 1 host in `control` (no HA) or 3 (survives one lost host)")
    else:
        add(f"group control: {n} hosts ({names}); m3deploy builds and tests a control plane of 1 or 3 hosts "
            "(3 survive one lost host; a 5-member etcd is valid but every write waits for 3 members and it is not "
            "tested here). Fix: put 3 hosts in `control` and the others in `workers`")


# unique host names, addresses and ssh_hostname: m3deploy.core.inventory (the loader) and core.inputs


def check_plan(plan, hosts) -> list[str]:
    cat = catalog.catalog()
    problems: list[str] = []
    add = problems.append
    parsers = cat["model"]["parsers"].get(plan.engine, {})
    cat_engines = catalog.engines()
    problems += inputs.derived_port_problems(plan, hosts) + ports.problems(plan, hosts)
    for hp in plan.hosts:
        for svc in hp.services:
            argv = list(svc.argv)
            pairs = {}
            for i, tok in enumerate(argv):
                if tok.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    pairs[tok.replace("_", "-")] = argv[i + 1]  # engines take --block_size as --block-size
            for flag in ("--block-size", "--kv-cache-block-size", "--kv-block-size", "--page-size"):
                if flag in pairs and pairs[flag] != str(cat["model"]["block_size"]):
                    add(f"host {hp.name} {svc.name}: {flag} {pairs[flag]}: MiniMax-M3 needs block size "
                        f"{cat['model']['block_size']} (MSA sparse "
                        f"block; other sizes misalign sparse attention). Fix: remove it from m3_extra_args")
            for flag, kind in (("--reasoning-parser", "reasoning"), ("--tool-call-parser", "tool_call"),
                               ("--dyn-reasoning-parser", "reasoning"), ("--dyn-tool-call-parser", "tool_call")):
                # --dyn-* parsers are the Dynamo runtime's names, whatever the engine
                want = (cat["model"]["parsers"]["dynamo"] if flag.startswith("--dyn-") and plan.engine != "mocker"
                        else parsers)
                if flag in pairs and want and pairs[flag] != want[kind]:
                    add(f"host {hp.name} {svc.name}: {flag} {pairs[flag]}: MiniMax-M3 uses the {want[kind]!r} "
                        f"parser on {plan.engine} (minimax_m2 is the previous release's). Fix: remove it from "
                        "m3_extra_args")
            flags = catalog.by_serving((cat_engines.get(plan.engine) or {}).get("parallel") or {}, plan.serving)
            if svc.kind == "worker" and "tp" in flags and "dp" in flags and {flags["tp"], flags["dp"]} <= set(argv):
                add(f"host {hp.name} {svc.name}: both {flags['dp']} and {flags['tp']}: {plan.parallel} runs "
                    f"data-parallel ranks of one GPU each. Fix: remove {flags['tp']} from m3_extra_args (or the "
                    "recipe layer that sets it)")
            if svc.kind == "worker" and not (cat_engines.get(plan.engine) or {}).get("simulated"):
                problems += _unstaged_repos(plan, hp.name, svc, cat_engines.get(plan.engine) or {})
                problems += image_problems(plan, hp.name, svc, cat_engines.get(plan.engine) or {})
    return problems


def _unstaged_repos(plan, host: str, svc, rules) -> list[str]:
    """Workers run with HF_HUB_OFFLINE=1: a repo in argv that the plan's model_repos lacks is never staged."""
    from m3deploy.core import repos

    staged = {r.repo for r in plan.model_repos}
    served = {"--served-model-name", rules.get("served_name_flag") or "--served-model-name"}  # a name, not a repo
    known = ", ".join(rules.get("repo_args") or {}) or "none"
    return [f"host {host} {svc.name}: {flag} names the Hugging Face repo {repo}, which is not in the plan's "
            f"model_repos, so it is never staged and the worker (HF_HUB_OFFLINE=1) cannot load it. Fix: pass it "
            f"with a flag engines.yaml `repo_args` lists for {plan.engine} ({known}), or remove it from m3_extra_args"
            for flag, repo in repos.references(svc.argv) if flag not in served and repo not in staged]


FLOATING_TAGS = ("latest", "nightly", "main", "stable")


def image_problems(plan, host: str, svc, rules) -> list[str]:
    """A worker's image names its engine version (engines.yaml `images:`, or at least a version tag or digest),
    and under Dynamo that version is one the pinned Dynamo's worker module runs with (engines.yaml `dynamo:`)."""
    image = svc.base_image or svc.image
    if not image or plan.engine == "mocker":
        return []
    where = f"host {host} {svc.name}: image {image}"
    name, _, digest = image.partition("@")
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    known = rules.get("images") or {}
    pinned = ", ".join(sorted(known)) or "none"
    if not digest and (not tag or tag in FLOATING_TAGS):
        return [(f"{where} is a floating tag ({tag or 'no tag'}): a re-pull changes the engine, so no flag contract "
                 f"holds. Fix: set m3_image to a version tag or a digest (checked ones: {pinned})")]
    entry = known.get(image)
    rng = (rules.get("dynamo") or {}).get(str(plan.dynamo_version)) if plan.serving == "dynamo" else None
    if not entry or not rng:
        return []
    have = _version(str(entry["version"]))
    if have < _version(str(rng["min"])):
        return [(f"{where} carries {plan.engine} {entry['version']}, older than Dynamo {plan.dynamo_version} works "
                 f"with (>= {rng['min']}): {rng['why_min']}. Fix: an image of {plan.engine} {rng['min']} or later, "
                 f"below {rng['below']}")]
    if have >= _version(str(rng["below"])):
        return [(f"{where} carries {plan.engine} {entry['version']}, newer than Dynamo {plan.dynamo_version} works "
                 f"with (< {rng['below']}): {rng['why_below']}. Fix: an image of {plan.engine} >= {rng['min']} and "
                 f"< {rng['below']}, or m3_serving = 'standalone'")]
    return []


def _version(v: str) -> tuple:
    """`0.31.0`, `1.3.0rc29` -> comparable (a release sorts after its release candidates)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:rc(\d+))?(?:[.+-].*)?", v)
    if not m:
        raise ValueError(f"engines.yaml: {v!r} is not an engine version")
    nums = tuple(int(x) for x in m.group(1).split("."))
    return nums + (0,) * (4 - len(nums)) + ((int(m.group(2)),) if m.group(2) else (1 << 30,))
