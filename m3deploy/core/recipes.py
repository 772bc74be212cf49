"""Recipes as data: load the layered YAML (m3deploy/core/data/layers/) and resolve it for one worker or frontend.

Layer order is the file order (00-base, 10-variants, ... 70-engines), then top to bottom inside a file,
then the cluster's own overrides (m3_image, m3_extra_env, m3_extra_args, m3_unset_args). Last writer wins,
and every value remembers the layer that set it (`m3deploy plan --explain`).
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m3deploy.core import catalog
from m3deploy.core.errors import M3Error
from m3deploy.core.model import Provenance

_WHEN_KEYS = {"engine", "serving", "vendor", "generation", "platform", "variant", "parallel", "ep", "dp_mode", "disagg",
              "multi_host", "features", "runtime"}
_LAYER_KEYS = {"name", "when", "target", "image", "docker", "env", "args", "unset", "readiness_timeout_s", "scope"}


@dataclass(frozen=True)
class Layer:
    name: str
    source: str
    when: dict
    target: str
    image: Any
    docker: list | None
    env: dict
    args: dict
    unset: list
    readiness_timeout_s: int | None
    scope: str | None = None  # the features in `when` apply only where the rest of `when` matches


@dataclass
class Resolved:
    """The outcome of applying the layers: ordered args/env with provenance per key."""

    image: str | None = None
    docker: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # name -> value (insertion order kept)
    args: dict = field(default_factory=dict)  # flag -> value or None (boolean flag)
    readiness_timeout_s: int = 600
    provenance: dict = field(default_factory=dict)  # key -> (value, layer, source)

    def set_arg(self, flag: str, value, layer: str, source: str, setting: str = "") -> None:
        self.args[flag] = value
        self.provenance[flag] = (value, layer, source, setting)

    def set_env(self, name: str, value, layer: str, source: str, setting: str = "") -> None:
        if value is None:
            self.env.pop(name, None)
        else:
            self.env[name] = str(value)
        self.provenance[f"env:{name}"] = (value, layer, source, setting)

    def unset(self, key: str, layer: str, source: str) -> None:
        if key in self.args:
            del self.args[key]
            self.provenance[key] = (None, layer, source)
        if key in self.env:
            del self.env[key]
            self.provenance[f"env:{key}"] = (None, layer, source)

    def argv(self) -> list[str]:
        out: list[str] = []
        for flag, value in self.args.items():
            out.append(flag)
            if value is not None:
                out.append(str(value))
        return out

    def provenance_records(self) -> tuple[Provenance, ...]:
        return tuple(Provenance(key=k, value=None if rec[0] is None else str(rec[0]), layer=rec[1], source=rec[2],
                                setting=rec[3] if len(rec) > 3 else "")
                     for k, rec in self.provenance.items())


def layers() -> tuple[Layer, ...]:
    """Every layer, in order (m3deploy.core.catalog.layer_files: the shipped ones and any M3DEPLOY_RECIPES)."""
    return _layers(tuple(catalog.layer_files()))


@functools.lru_cache(maxsize=8)
def _layers(files: tuple[tuple[str, Path], ...]) -> tuple[Layer, ...]:
    out = []
    for rel, path in files:
        with open(path) as f:
            doc = catalog.load_yaml(f) or {}
        for i, raw in enumerate(doc.get("layers", [])):
            unknown = set(raw) - _LAYER_KEYS
            bad_when = set(raw.get("when", {})) - _WHEN_KEYS
            if unknown or bad_when or "name" not in raw:
                raise M3Error(f"{rel}: layer #{i + 1} ({raw.get('name', '?')}) has unknown keys "
                              f"{sorted(unknown | bad_when)} or no name; valid layer keys: {sorted(_LAYER_KEYS)}, "
                              f"valid `when` keys: {sorted(_WHEN_KEYS)}")
            out.append(Layer(
                name=raw["name"], source=rel, when=raw.get("when", {}), target=raw.get("target", "worker"),
                image=raw.get("image", ...), docker=raw.get("docker"), env=raw.get("env") or {},
                args=raw.get("args") or {}, unset=raw.get("unset") or [],
                readiness_timeout_s=raw.get("readiness_timeout_s"), scope=raw.get("scope")))
    return tuple(out)


def matches(when: dict, ctx: dict) -> bool:
    """Does a layer's `when` hold in `ctx`? (every key: equal, one of a list, or features a subset)"""
    for key, want in when.items():
        have = ctx.get(key)
        if key == "features":
            if not set(want) <= set(have or ()):
                return False
        elif isinstance(want, list):
            if have not in want:
                return False
        elif have != want:
            return False
    return True


def _fill(value, ctx: dict, layer: Layer):
    if value is None:
        return None
    text = str(value)
    if "{" not in text:
        return text
    # Only `{name}` placeholders with a plain identifier are ours; JSON braces stay as they are.
    def sub(m):
        key = m.group(1)
        if key not in ctx or ctx[key] is None:
            raise M3Error(f"{layer.source}: layer {layer.name} needs `{key}` but the cluster does not set it "
                          f"(set m3_{key} in group_data)")
        return str(ctx[key])

    return re.sub(PLACEHOLDER, sub, text)


PLACEHOLDER = r"\{([a-z_][a-z0-9_]*)\}"


def _settings_of(value, sources: dict) -> str:
    """The inventory settings a layer value's `{placeholders}` read (`sources`: placeholder -> setting)."""
    used = dict.fromkeys(sources[k] for k in re.findall(PLACEHOLDER, str(value or "")) if sources.get(k))
    return "; ".join(used)


def resolve(ctx: dict, target: str = "worker", sources: dict | None = None) -> Resolved:
    """Apply every matching layer for `target` ("worker" or "frontend") in order. `sources`: for each `{placeholder}`
    the inventory setting it stands for (provenance: `m3deploy plan --explain` names the setting behind a value)."""
    sources = sources or {}
    r = Resolved()
    for layer in layers():
        if layer.target != target or not matches(layer.when, ctx):
            continue
        if layer.image is not ...:
            r.image = layer.image
            r.provenance["image"] = (layer.image, layer.name, layer.source)
        if layer.docker is not None:
            r.docker = list(layer.docker)
            r.provenance["docker"] = (" ".join(layer.docker), layer.name, layer.source)
        if layer.readiness_timeout_s is not None:
            r.readiness_timeout_s = int(layer.readiness_timeout_s)
            r.provenance["readiness_timeout_s"] = (layer.readiness_timeout_s, layer.name, layer.source)
        for key in layer.unset:
            r.unset(key, layer.name, layer.source)
        for name, value in layer.env.items():
            r.set_env(name, _fill(value, ctx, layer), layer.name, layer.source, _settings_of(value, sources))
        for flag, value in layer.args.items():
            r.set_arg(flag, _fill(value, ctx, layer), layer.name, layer.source, _settings_of(value, sources))
    return r


def parse_arg_list(tokens) -> list[tuple[str, str | None]]:
    """`["--a", "1", "--b"]` or `{"--a": "1", "--b": None}` -> [("--a", "1"), ("--b", None)]."""
    if isinstance(tokens, dict):
        return [(str(k), None if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else str(v)))
                for k, v in tokens.items()]
    out: list[tuple[str, str | None]] = []
    tokens = [str(t) for t in tokens]
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("-"):
            raise M3Error(f"m3_extra_args: expected a flag at {tok!r} (write flags as '--name value' or a dict)")
        if "=" in tok and tok.startswith("--"):
            k, v = tok.split("=", 1)
            out.append((k, v))
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out.append((tok, tokens[i + 1]))
            i += 2
        else:
            out.append((tok, None))
            i += 1
    return out
