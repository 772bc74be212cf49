"""The catalog: what m3deploy knows about the model, its variants and the platforms (data/catalog.yaml), and
where the recipe data lives.

Every platform fact has its owner here: GPU vendor, count and memory, arch, fabric (what `fabric:` runs:
fabric manager on HGX, IMEX on NVL72), the vendor's driver branch or ROCm minimum and the supported OSes. The
plan, validation, preflight and the roles read them through this module, never restate them.

Extra recipe data (a new platform, a site's own layers) comes from directories named in the environment
variable M3DEPLOY_RECIPES (os.pathsep-separated), each laid out like data/: an optional `catalog.yaml`
(merged over the shipped one: mappings key by key, lists extended) and `layers/NN-*.yaml` (sorted by file
name together with the shipped layers). docs/ARCHITECTURE.md "Adding a platform" shows it.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).resolve().parent / "data"
EXTRA_ENV = "M3DEPLOY_RECIPES"


def data_dirs() -> tuple[Path, ...]:
    """The shipped data directory, then any named in M3DEPLOY_RECIPES."""
    extra = [Path(p) for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p]
    return (DATA_DIR, *extra)


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(over, list):
        return base + [v for v in over if v not in base]
    return over


# libyaml's parser when PyYAML has it (PyPI's wheels do): the same documents, ~10x faster than the pure-Python one,
# which was the biggest share of the plan's time on every run (a no-change re-run parses the catalog and layers anew)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(stream) -> Any:
    """yaml.safe_load with libyaml's parser when there is one."""
    return yaml.load(stream, Loader=_LOADER)  # a safe loader: plain data only


@functools.lru_cache(maxsize=8)
def _load(name: str, dirs: tuple[Path, ...]) -> dict:
    out: dict = {}
    for d in dirs:
        path = d / name
        if path.exists():
            with open(path) as f:
                out = _merge(out, load_yaml(f) or {})
    return out


def catalog() -> dict:
    """data/catalog.yaml (with any M3DEPLOY_RECIPES catalog.yaml merged over it)."""
    return _load("catalog.yaml", data_dirs())


def tls_profile() -> dict:
    """data/tls.yaml's named profile (Mozilla "intermediate"): what the edge, etcd and NATS offer. Keys: name,
    min_version, tls12 ([[OpenSSL name, Go name], ...]), tls13, haproxy_options; and `openssl`, `go`: the TLS 1.2
    suites in each spelling."""
    data = _load("tls.yaml", data_dirs())
    prof = data["profiles"][data["profile"]]
    return {"name": data["profile"], **prof, "openssl": [o for o, _ in prof["tls12"]],
            "go": [g for _, g in prof["tls12"]]}


def engines() -> dict:
    """data/engines.yaml: per engine and serving mode, the launch command, flag names and multi-host rules."""
    return _load("engines.yaml", data_dirs())


def layer_files() -> list[tuple[str, Path]]:
    """(source name, path) of every layer file, in layer order (file name, shipped first on a tie)."""
    files = []
    for i, d in enumerate(data_dirs()):
        for path in (d / "layers").glob("[0-9][0-9]-*.yaml"):
            src = f"m3deploy/core/data/layers/{path.name}" if d == DATA_DIR else str(path)
            files.append((path.name, i, src, path))
    return [(src, path) for _, _, src, path in sorted(files)]


def by_serving(rule, serving: str):
    """An engines.yaml value that may differ per serving mode ({standalone: x, dynamo: y})."""
    return rule[serving] if isinstance(rule, dict) and serving in rule else rule


def platform(name: str) -> dict:
    return catalog()["platforms"][name]


def vendor(name: str) -> dict:
    """The vendor's driver facts (vendors: in catalog.yaml): nvidia driver_branch/driver_flavor, amd rocm."""
    return catalog()["vendors"].get(name, {})


def fabric_services(platform_name: str) -> tuple[str, ...]:
    """The services a platform's GPU fabric needs on its hosts (nvidia-fabricmanager, nvidia-imex)."""
    fabric = platform(platform_name).get("fabric")
    return tuple(catalog()["fabrics"].get(fabric, ())) if fabric else ()


def supported_os() -> set[tuple[str, str]]:
    """The OSes GPU hosts are supported on: {("ubuntu", "24.04"), ...}."""
    return {tuple(str(x).split(" ", 1)) for x in catalog()["supported_os"]}


def model_constants(engine: str) -> dict[str, Any]:
    """The model's constants, written once in catalog.yaml `model:` and read as placeholders by the recipe layers
    (`{block_size}`, `{max_context}`, `{reasoning_parser}`, `{tool_call_parser}`: the engine's parser names;
    `{dyn_reasoning_parser}`, `{dyn_tool_call_parser}`: the Dynamo runtime's) and by validation."""
    m = catalog()["model"]
    parsers, dyn = m["parsers"].get(engine) or {}, m["parsers"].get("dynamo") or {}
    return {"block_size": m["block_size"], "max_context": m["max_context"], "native_context": m["native_context"],
            "reasoning_parser": parsers.get("reasoning"), "tool_call_parser": parsers.get("tool_call"),
            "dyn_reasoning_parser": dyn.get("reasoning"), "dyn_tool_call_parser": dyn.get("tool_call")}


def version_tuple(v: str) -> tuple[int, ...]:
    """The numbers of the first dotted version in `v`: "580.95.05" -> (580, 95, 5), "7.2.0-43" -> (7, 2, 0),
    "rocm-7.2" -> (7, 2), "" -> (). The one version parser of the drivers role, preflight and the facts."""
    m = re.search(r"\d+(?:\.\d+)*", v or "")
    return tuple(int(x) for x in m.group().split(".")) if m else ()


def engine_rules(engine: str, platform_name: str | None = None) -> dict:
    """engines.yaml's rules for `engine` on `platform_name`: on a platform without GPUs (vendor none) the engine's
    `cpu:` block (its CPU build: launch line, wheels, model) over them, with `cpu` kept; else the rules as written."""
    rules = engines()[engine]
    cpu = rules.get("cpu")
    if cpu and platform_name in catalog()["platforms"] and platform(platform_name)["vendor"] == "none":
        return {**rules, **cpu}
    return rules


def cpu_build(engine: str, platform_name: str | None) -> dict | None:
    """The engine's `cpu:` block where it runs as its CPU build (a platform without GPUs), else None."""
    rules = engines().get(engine) or {}
    return rules.get("cpu") if engine_rules(engine, platform_name) is not rules else None
